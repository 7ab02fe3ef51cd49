"""The replica guard: ``check_replicas=N`` on every front end (framework-agnostic part).

Data-parallel training rests on every rank holding bit-identical parameters. Anything that makes
them differ in the last bit (a sum taken in another order on one rank, a rank-dependent
rounding) grows step after step and is silent: the loss looks fine, and a checkpoint depends on
the rank that wrote it. Every N steps the guard compares, across the process set, one 64-bit
checksum of the bits of every parameter and of the compressor's counters. On the host (CPU tensors, and TensorFlow's)::

    checksum(x) = crc32(bytes of x) · 2^32 + (sum of x's 64-bit words mod 2^32)

CRC-32 detects every single-bit change and every burst of up to 32 bits, wherever it is (so a
reordering of elements as well), at memory speed with zlib. On a CUDA device the bytes are not
copied to the host; there::

    checksum(x) = sum_i b_i * (2i + 1)   (mod 2^64)

where ``b_i`` is element i's bit pattern read as a signed integer of its own width: the weights
are odd, hence invertible mod 2^64, so a change in any single element always changes it, and so
does swapping two unequal elements; modular integer sums are exact and associative, so it is the
same however the device splits the reduction. Every rank of a job uses the same definition
(ranks share a device type).

The counters row holds a checksum of the compressor's schedule state (``state_dict()``: step,
epoch) and of every per-tensor Python-number state entry (random-k's step), in name order:
ranks whose compressors count differently would draw different random indices or sparsities.

Cost: one pass over the parameters and one allgather of ``8·(number of parameters + 1)`` bytes
per rank every N steps; ``benchmarks/replica_check.py`` measures it. On a mismatch every rank
sees the same gathered table and raises :class:`ReplicaMismatch` naming the first parameter
(in name order) that differs, the step, and which ranks hold which value.
"""
from __future__ import annotations

import os
import zlib
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..contract.validation import is_integer
from ..ops.checksum import signed64
from ..ops.facade import Ops
from ..transport.collectives import Collectives

ENV_VAR = "HVDCOMPRESS_CHECK_REPLICAS"
COUNTERS = "<compressor counters>"


class ReplicaMismatch(RuntimeError):
    """Raised on every rank when the replicas' parameters (or compressor counters) differ."""


def check_every(value: Optional[int], environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """The ``check_replicas`` argument, or ``HVDCOMPRESS_CHECK_REPLICAS`` when it is None:
    None or 0 (off) or an integer N >= 1 (check every N steps)."""
    source = "check_replicas"
    if value is None and environ.get(ENV_VAR, "").strip():
        source, text = ENV_VAR, environ[ENV_VAR].strip()
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{ENV_VAR}={text!r}: allowed: an integer >= 0 (0: off)") from None
    if value is None:
        return None
    if not is_integer(value) or value < 0:
        raise ValueError(f"{source}={value!r}: allowed: None, 0 (off) or an integer N >= 1 "
                         "(compare the replicas every N steps)")
    return int(value) or None


def counters_checksum(compressor_state: Mapping[str, Any], tensor_states: Sequence[tuple]) -> int:
    """A signed 64-bit checksum of the compressor's ``state_dict()`` and of the Python-number
    entries of each ``(name, state)`` in ``tensor_states`` (tensors in state are per rank by
    nature, residuals and momenta, and are left out)."""
    parts = [repr(sorted(compressor_state.items()))]
    for name, state in tensor_states:
        numbers = sorted((k, v) for k, v in state.items() if isinstance(v, (bool, int, float)))
        if numbers:
            parts.append(f"{name}:{numbers!r}")
    text = "\n".join(parts).encode()
    return signed64((zlib.crc32(text) << 32) | zlib.adler32(text))


class ReplicaCheck:
    """Counts steps and, every ``every`` steps, compares the replicas over ``comm``.

    ``ranks``: the global rank of each index of the process set (for the error message).
    """

    def __init__(self, every: Optional[int], ops: Ops, comm: Collectives,
                 ranks: Optional[Sequence[int]] = None):
        self.every = every
        self.ops = ops
        self.comm = comm
        self.ranks = list(ranks) if ranks is not None else None
        self.steps = 0

    def after_step(self, named: Callable[[], Sequence[tuple]], counters: Callable[[], int]) -> None:
        """Count one step; on every ``every``-th, compare ``named()`` ((name, tensor) in an
        order the same on every rank) and ``counters()`` (:func:`counters_checksum`) across
        ranks. Both are called only then: the other steps cost a counter."""
        self.steps += 1
        if self.every is None or self.steps % self.every:
            return
        named = named()
        if not named:
            return
        sums = self.ops.checksums([t for _, t in named])
        local = self.ops.concat([sums, self.ops.from_numpy(np.array([counters()], dtype=np.int64),
                                                           like=sums)])
        gathered = self.comm.wait(self.comm.allgather([local], f"hvdc.replicas.{self.steps}"))[0]
        table = self.ops.to_numpy(gathered).reshape(self.comm.world, -1)
        self.compare([n for n, _ in named] + [COUNTERS], table)

    def compare(self, names: Sequence[str], table: np.ndarray) -> None:
        """Raise :class:`ReplicaMismatch` at the first column of ``table`` (ranks x names) whose
        values differ."""
        differs = np.nonzero((table != table[0]).any(axis=0))[0]
        if not len(differs):
            return
        col = int(differs[0])
        holders: dict = {}
        for index, value in enumerate(table[:, col].tolist()):
            holders.setdefault(value, []).append(index if self.ranks is None else self.ranks[index])
        groups = "; ".join(f"ranks {r} hold checksum {v:#018x}" for v, r in
                           ((v & (1 << 64) - 1, r) for v, r in holders.items()))
        what = ("the compressors' step counters" if names[col] == COUNTERS
                else f"parameter '{names[col]}'")
        more = f" (and {len(differs) - 1} more)" if len(differs) > 1 else ""
        raise ReplicaMismatch(f"replicas differ at step {self.steps}: {what}{more} is not "
                              f"bit-identical across ranks: {groups}")
