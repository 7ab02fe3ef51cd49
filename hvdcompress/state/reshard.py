"""Compressor state at another world size: what a checkpoint written at P ranks becomes at P'.

Framework-neutral (numpy): the torch optimizer (``state_dict(gather=True)``, its
``load_state_dict``) and the elastic state (:mod:`hvdcompress.torch.elastic`) call it.

Two kinds of per-tensor state (the keys of :data:`PER_RANK`, everything else):

* **per-rank, additive**: error-feedback residuals (``residual``, ``quant_residual``), the
  momentum of DGC/CSC and of the ``Momentum`` decorator (``momentum``) and DGC's velocity
  (``velocity``). Rank r holds its own e_r; what it stands for in the update is linear in it:
  with op=Average the exchanged mean carries Σ_r e_r / P of it (over the following steps, for a
  momentum scaled by powers of μ), with op=Sum Σ_r e_r.
* **replicated**: identical on every rank (FrozenAdam's ``adam.m`` / ``adam.v``, PowerSGD's warm
  ``powersgd_q``, step counters): rank 0's value is kept.

The rule, with every rank's state gathered at save time (one rank's checkpoint holds one
rank's residual only: the others' unsent mass would be lost)::

    T = Σ_r e_r  +  Σ_r s_r                       (float64; s_r: rank r's server residual, below)
    e'_r' = T / P    for every new rank r'        op=Average:  Σ_r' e'_r' / P' = T / P
    e'_r' = T / P'   for every new rank r'        op=Sum:      Σ_r' e'_r'      = T

so the unsent error-feedback mass (and the mean momentum, the mean velocity) that enters the
update is preserved, up to one rounding of T / P (or T / P') to the state's dtype: the result
is within half a unit in the last place of float32 of the exact value. Every new rank gets the
same share: the ranks of the new run see other data than the old ones, so there is no better
owner for a residual than anyone; the price is that the spread between ranks (Σ_r e_r² for a
given Σ_r e_r) is not kept, which only the first moment enters the update through.

Layouts. The compressed allreduce (:mod:`hvdcompress.engines.exchange`) keeps the state of segment j
of the P-way cut under ``seg<j>.`` and the server-side residual of the segment rank r reduces
under ``sum.`` on rank r; both depend on P. Segments are concatenated back to the whole tensor
(cut to its size) before the rule, and split again for P' (zero-padded) after it. The server
residual is in the units of the sum over ranks, so it enters T as it is and is folded into the
ranks' own residuals (the new run's server residuals start at 0): the delivered mass is the
same. At P' = P with the same layout, every rank keeps its own state, bit for bit.

Two-level compression (``cross.`` state, :mod:`hvdcompress.engines.two_level`) resumes at the same P
only; :func:`redistribute` raises otherwise.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

#: the per-tensor state keys that are per-rank and additive (see the module doc)
PER_RANK = frozenset({"residual", "quant_residual", "momentum", "velocity"})
SERVER = "sum."
CROSS = "cross."
_SEGMENT = re.compile(r"^seg(\d+)\.(.+)$")


def split_key(key: str) -> tuple:
    """``(segment, base)``: ``("seg", j, base)`` for ``seg<j>.base``, ``("sum", None, base)`` for
    ``sum.base``, ``(None, None, key)`` otherwise."""
    m = _SEGMENT.match(key)
    if m:
        return "seg", int(m.group(1)), m.group(2)
    if key.startswith(SERVER):
        return "sum", None, key[len(SERVER):]
    return None, None, key


def segments_of(state: Mapping[str, Any]) -> int:
    """The number of segments of a tensor's compressed-allreduce state (0: the whole tensor)."""
    found = [split_key(k)[1] for k in state if split_key(k)[0] == "seg"]
    return max(found) + 1 if found else 0


def _layout(state: Mapping[str, Any]) -> Optional[int]:
    """The layout of a tensor's own per-rank state: its number of segments, 0 for the whole
    tensor, None when it has none at this level (a stateless node level of two-level)."""
    if segments_of(state):
        return segments_of(state)
    return 0 if any(split_key(k)[2] in PER_RANK for k in state) else None


def has_per_rank(state: Mapping[str, Any]) -> bool:
    """Whether the tensor's state holds any per-rank additive entry."""
    return any(split_key(k)[2] in PER_RANK for k in state)


def misfit(state: Mapping[str, Any], numel: int, world: int,
           size: Callable[[Any], Optional[int]]) -> Optional[tuple]:
    """The first per-rank entry of a tensor's ``state`` whose size does not follow the tensor's
    ``numel``, as ``(key, its size, the size expected)``; None when all do. A whole-tensor entry
    has ``numel`` elements; a segment or server entry of the compressed allreduce at ``world``
    ranks ⌈numel / world⌉. ``size(value)``: its number of elements, None for a number."""
    for key in sorted(state):
        where, _, base = split_key(key)
        held = size(state[key]) if base in PER_RANK else None
        expected = numel if where is None else -(-numel // world)
        if held is not None and held != expected:
            return key, held, expected
    return None


def _whole(state: Mapping[str, Any], base: str, numel: int, segments: int) -> Optional[np.ndarray]:
    """Rank's ``base`` over the whole tensor in float64 (its segments concatenated, cut to
    ``numel``), or None when it has none."""
    if base in state:
        return np.asarray(state[base], np.float64).reshape(-1)[:numel]
    pieces = [state.get(f"seg{j}.{base}") for j in range(segments)]
    if not segments or any(p is None for p in pieces):
        return None
    return np.concatenate([np.asarray(p, np.float64).reshape(-1) for p in pieces])[:numel]


def _server(state: Mapping[str, Any], base: str, rank: int, numel: int, world: int) -> Optional[np.ndarray]:
    """Rank ``rank``'s server residual (``sum.base``, of segment ``rank``) placed in the whole
    tensor, in float64, or None."""
    if SERVER + base not in state:
        return None
    piece = np.asarray(state[SERVER + base], np.float64).reshape(-1)
    out = np.zeros(-(-numel // world) * world)
    out[rank * piece.size:(rank + 1) * piece.size] = piece
    return out[:numel]


def _dtype(states: Sequence[Mapping[str, Any]], base: str) -> np.dtype:
    for state in states:
        for key, value in state.items():
            if split_key(key)[2] == base and isinstance(value, np.ndarray):
                return value.dtype
    return np.dtype(np.float32)


def _cut(flat: np.ndarray, parts: int) -> list:
    """``flat`` zero-padded to a multiple of ``parts`` and cut into ``parts`` equal segments
    (the engine's :meth:`~hvdcompress.engines.exchange.Exchange.segments`)."""
    length = -(-flat.size // parts)
    padded = np.concatenate([flat, np.zeros(length * parts - flat.size, flat.dtype)])
    return [padded[j * length:(j + 1) * length].copy() for j in range(parts)]


def pooled(states: Sequence[Mapping[str, Any]], base: str, numel: int, world: int, new_world: int,
           average: bool) -> Optional[np.ndarray]:
    """Every new rank's share of the per-rank entry ``base`` (the module doc's rule), in the
    state's dtype, over the whole tensor; None when no old rank holds it."""
    total, found = np.zeros(numel), False
    for rank, state in enumerate(states):
        for part in (_whole(state, base, numel, segments_of(state)),
                     _server(state, base, rank, numel, world)):
            if part is not None:
                total += part
                found = True
    if not found:
        return None
    return (total / (world if average else new_world)).astype(_dtype(states, base))


def redistribute(states: Sequence[Mapping[str, Any]], numel: int, new_world: int, new_rank: int,
                 average: bool, new_segments: int) -> dict:
    """Rank ``new_rank``'s state of one tensor of ``numel`` elements in a run of ``new_world``
    ranks, from the states of every rank of the old run (``states[r]``: rank r's, numpy arrays
    and Python numbers, in rank order; their number is the old world size).

    ``average``: op=Average (else op=Sum). ``new_segments``: the new layout, 0 for state kept
    over the whole tensor, else the number of segments of the compressed allreduce
    (``new_world``). Per-rank entries follow :func:`pooled`; replicated entries are rank 0's,
    a replicated entry of a segment (a counter) is copied from segment 0 to every new segment.
    At the same world size and layout (two-level's included), rank ``new_rank``'s own state is
    returned unchanged.
    """
    world = len(states)
    if world < 1:
        raise ValueError("redistribute: states is empty; allowed: one state dict per old rank")
    if not 0 <= new_rank < new_world:
        raise ValueError(f"redistribute: new_rank={new_rank} with new_world={new_world}; allowed: "
                         f"0 <= new_rank < new_world")
    if world == new_world and _layout(states[new_rank]) in (None, new_segments):
        return dict(states[new_rank])
    cross = sorted({k for s in states for k in s if k.startswith(CROSS)})
    if cross:
        raise ValueError(f"two-level compression state ({cross[0]!r}, ...) written at {world} ranks "
                         f"cannot be redistributed to {new_world} ranks: resume two-level "
                         "(intra_node=) runs at the same world size, or drop the compressor state")
    if new_segments not in (0, new_world):
        raise ValueError(f"redistribute: new_segments={new_segments}; allowed: 0 (whole tensor) "
                         f"or new_world={new_world}")
    out: dict = {}
    first = states[0]
    for key, value in first.items():   # replicated entries: rank 0's
        where, j, base = split_key(key)
        if base in PER_RANK:
            continue
        if where is None:
            out[key] = value
        elif new_segments and (where == "sum" or j == 0):
            if isinstance(value, np.ndarray) and value.size != -(-numel // new_segments) and value.ndim:
                raise ValueError(f"redistribute: segment entry {key!r} has {value.size} elements, "
                                 f"which do not follow the segment length; it cannot be carried "
                                 f"from {world} to {new_world} ranks")
            for target in ([SERVER + base] if where == "sum" else
                           [f"seg{i}.{base}" for i in range(new_segments)]):
                out[target] = value
    for base in sorted({split_key(k)[2] for s in states for k in s} & PER_RANK):
        share = pooled(states, base, numel, world, new_world, average)
        if new_segments:
            out.update({f"seg{j}.{base}": piece for j, piece in enumerate(_cut(share, new_segments))})
        else:
            out[base] = share
    return out


def share_of_rank(states: Sequence[Mapping[str, Any]], numel: int, world: int, rank: int,
                  average: bool, saved_average: Optional[bool], alltoall: Callable[[], bool],
                  who: str) -> dict:
    """What a front end loads for one tensor from a gathered state: :func:`redistribute` to
    ``rank`` of ``world``, laid out as this run cuts the tensor (``alltoall()``: whether it runs
    the compressed allreduce here, asked only when there is state). ``saved_average``: the op
    the state was gathered with (None: not recorded); a state of the other op is refused when
    it holds per-rank entries, whose share depends on the op (a ``ValueError`` naming ``who``)."""
    if saved_average not in (None, average) and any(has_per_rank(st) for st in states):
        ops = {True: "hvd.Average", False: "hvd.Sum"}
        raise ValueError(f"{who}: the state was gathered with op={ops[saved_average]} and this run "
                         f"has op={ops[average]}; the residuals' share of each rank depends on it: "
                         "use the same op")
    layout = world if any(states) and alltoall() else 0
    return redistribute(states, numel, world, rank, average, layout)
