"""Random keys and per-tensor step counters: where every compressor's randomness comes from.

Policy (one for all compressors):

* A per-tensor random draw (stochastic rounding's uniforms, random-k's indices, PowerSGD's
  initial Q) is keyed by ``(seed, step, tensor name)``, plus the rank where ranks must draw
  independently. ``step`` is the tensor's own counter ``state["step"]``, the number of times
  this tensor was compressed (:func:`advance_step`); it lives in the tensor's state, so a
  checkpoint restores it with the residuals.
* Compressor-wide schedules (DGC's warm-up and its sample start) count optimizer steps and
  epochs instead: :class:`hvdcompress.contract.schedule.SparsityWarmup`.

Derivations (kept bit-identical: the kernels, their fallback and every framework path draw the
same codes for the same key, see ``tests/test_paths_identical.py``):

* :func:`step_key`: CRC-32 of ``"seed:step:name"``, a 32-bit key for the kernels'
  counter-based hash and for DGC's sample start.
* :func:`rank_key`: ``key xor (rank · 0x9E3779B1 mod 2³²)``; the odd golden-ratio constant
  spreads consecutive ranks over the whole 32-bit range, so rounding errors of different
  ranks are independent and the average's variance falls as 1/N.
* :func:`generator`: numpy's PCG64 seeded through a SeedSequence of integer words (e.g.
  ``seed, step, tensor_id(name)``), for draws every rank must share.
"""
from __future__ import annotations

import zlib

import numpy as np

GOLDEN = 0x9E3779B1


def tensor_id(name: str) -> int:
    """A 32-bit integer for a tensor name (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(name.encode())


def advance_step(state: dict) -> int:
    """This tensor's step (``state["step"]``, 0 at first), advanced by one for the next call."""
    step = int(state.get("step", 0))
    state["step"] = step + 1
    return step


def step_key(seed: int, step: int, name: str) -> int:
    """32-bit key of tensor ``name`` at ``step``: CRC-32 of ``"seed:step:name"``."""
    return zlib.crc32(f"{seed}:{step}:{name}".encode())


def rank_key(key: int, rank: int) -> int:
    """``key`` made distinct per rank: ``key xor (rank · 0x9E3779B1 mod 2³²)``."""
    return key ^ ((rank * GOLDEN) & 0xFFFFFFFF)


def generator(*words: int) -> np.random.Generator:
    """numpy's default generator seeded by the non-negative integers ``words`` (in order)."""
    return np.random.default_rng(list(words))


def next_rank_key(seed: int, state: dict, name: str, rank: int) -> int:
    """The per-rank key of tensor ``name`` at its current step (stochastic rounding); advances
    the step: ``rank_key(step_key(seed, step, name), rank)``."""
    return rank_key(step_key(seed, advance_step(state), name), rank)
