"""Compressor state of an FSDP2 HSDP run at another number of shards: the array re-layout.

Framework-neutral (numpy). The HSDP front end (:mod:`hvdcompress.torch.hsdp`) calls
:func:`for_shard` when it loads a checkpoint.

FSDP2's ``fully_shard`` (default placement ``Shard(0)``) gives shard j of S of a parameter of
shape ``(d0, *rest)`` the rows ``torch.chunk(param, S, dim=0)[j]`` (FSDP2's ``_chunk_with_empty``:
``c = ceil(d0 / S)`` rows a shard, rows ``[min(j·c, d0), min((j+1)·c, d0))``, so the last shards
are short or empty, e.g. d0 = 5 at S = 4: 2, 2, 1, 0 rows). The padding to ``c`` rows lives only
in FSDP's flat all-gather buffer: ``to_local()`` and its gradient are the unpadded rows. Flattened
row-major, shard j is the elements ``[start_j, stop_j)`` of the flattened parameter
(:func:`dim0_range`): the S flat local shards, concatenated in shard order, are the parameter.
HSDP keeps each parameter's compression state on rank (r, j)'s flat local shard, so at another
number of shards S' (:func:`reshard_dim0`), for each old replica r:

* coordinate-wise entries (:data:`COORDINATE`: the per-rank residuals, momenta and velocities of
  :data:`hvdcompress.state.reshard.PER_RANK`, FrozenAdam's ``adam.m`` and ``adam.v``) are
  concatenated over the old shards (an entry a shard lacks counts as zeros there: the state is
  made lazily at zero) and cut at the new shard's range, bit for bit;
* per-tensor entries (numbers and arrays that are no coordinates: step counters, FrozenAdam's
  ``adam.unit``) must be the same on every old shard, and are carried;
* anything else (an entry that differs across shards, as PowerSGD's warm Q, whose shape follows
  the shard's) cannot be cut: a ``ValueError`` naming the tensor and the entry.

The compressed allreduce's layout (``seg<k>.``: segment k of the R-way cut of the local shard,
``sum.``: rank r's server residual of segment r, :mod:`hvdcompress.state.reshard`) is first
brought back to the whole local shard: segments concatenated, the server residual added to its
rank's residual (the same total, one rounding in the state's dtype); another per-segment entry
cannot be cut. The result is the R old replicas' states of the new shard: the store's gathered
checkpoint of that shard, whose replica dimension the store then redistributes to R' replicas
(:func:`hvdcompress.state.reshard.redistribute`: the unsent mass and the mean momentum kept; the
replicated entries, m and v, rank 0's). At the same number of shards nothing is re-laid: shard
j's R states are returned as they were saved.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .reshard import PER_RANK, SERVER, _server, _whole, misfit, segments_of, split_key
from .store import Conversions, _check_params

#: the per-tensor state entries kept per coordinate of the flat local shard (cut along dim 0)
COORDINATE = PER_RANK | {"adam.m", "adam.v"}


def dim0_range(shape: Sequence[int], shards: int, index: int) -> tuple:
    """``(start, stop)``: the flat elements of FSDP2's shard ``index`` of ``shards`` (``Shard(0)``,
    ``torch.chunk`` rows, unpadded) in the flattened tensor of ``shape`` (at least one dim)."""
    if len(shape) < 1:
        raise ValueError(f"dim0_range: shape {tuple(shape)}; allowed: at least one dim (FSDP2 shards dim 0)")
    if not 0 <= index < shards:
        raise ValueError(f"dim0_range: index={index} with shards={shards}; allowed: 0 <= index < shards")
    rows, inner = int(shape[0]), math.prod(int(d) for d in shape[1:])
    chunk = -(-rows // shards)
    return min(index * chunk, rows) * inner, min((index + 1) * chunk, rows) * inner


def _fail(name: str, where: str, text: str) -> ValueError:
    return ValueError(f"tensor {name!r}{where}: {text}; allowed at another number of shards: entries "
                      f"per coordinate ({', '.join(sorted(COORDINATE))}), of the whole shard or of the "
                      "compressed allreduce's segments, and entries the same on every shard (counters, "
                      "adam.unit): resume at the saved number of shards, or drop the compressor state")


def whole_layout(state: Mapping[str, Any], numel: int, world: int, rank: int, name: str = "tensor",
                 where: str = "") -> dict:
    """Rank ``rank`` of ``world`` replicas' state of a local shard of ``numel`` elements with its
    coordinate entries over the whole shard (the segments ``seg<k>.`` concatenated, the server
    residual ``sum.`` added), each in its own dtype; other entries as they are. A ``ValueError``
    for a coordinate entry of another size, or a per-segment entry that is no coordinate."""
    out: dict = {}
    segments = segments_of(state)
    for key, value in state.items():
        kind, _, base = split_key(key)
        if base not in COORDINATE:
            if kind is not None:
                raise _fail(name, where, f"entry {key!r} is kept per segment of the compressed allreduce")
            out[key] = value
            continue
        size = np.asarray(value).size
        expected = numel if kind is None else -(-numel // world)
        if size != expected:
            raise ValueError(f"tensor {name!r}{where}: entry {key!r} holds {size} elements; expected "
                             f"{expected} (its shard's): the state is of another model or mesh")
    for base in sorted({split_key(k)[2] for k in state} & COORDINATE):
        dtype = next(np.asarray(v).dtype for k, v in state.items() if split_key(k)[2] == base)
        whole = _whole(state, base, numel, segments)
        if whole is None:
            raise _fail(name, where, f"entry {base!r} lacks some of its {segments} segments")
        server = _server(state, base, rank, numel, world) if SERVER + base in state else None
        out[base] = (whole if server is None else whole + server).astype(dtype)
    return out


def _same(values: list) -> bool:
    first = values[0]
    if isinstance(first, np.ndarray) or isinstance(values[-1], np.ndarray):
        return all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
                   and np.array_equal(v, first) for v in values)
    return all(not isinstance(v, np.ndarray) and v == first for v in values)


def reshard_dim0(states: Sequence[Sequence[Mapping[str, Any]]], shape: Sequence[int], new_shards: int,
                 new_shard: int, name: str = "tensor") -> list:
    """The old replicas' states of FSDP2's shard ``new_shard`` of ``new_shards`` of one tensor of
    ``shape`` (the module doc's rule), from ``states[j][r]``: old shard j's (of ``len(states)``),
    replica r's state (numpy arrays and Python numbers; R = ``len(states[j])`` replicas, the
    world of the segment layout). Returns a list of R states, replica order; at
    ``new_shards == len(states)``, shard ``new_shard``'s as they are. Pure: nothing is changed."""
    shards = len(states)
    if shards < 1 or not 0 <= new_shard < new_shards:
        raise ValueError(f"reshard_dim0: {shards} old shards, new_shard={new_shard} of "
                         f"new_shards={new_shards}; "
                         "allowed: at least one old shard, 0 <= new_shard < new_shards")
    replicas = len(states[0])
    if replicas < 1 or any(len(s) != replicas for s in states):
        raise ValueError(f"reshard_dim0: tensor {name!r}: old shards of {[len(s) for s in states]} replicas; "
                         "allowed: the same number (at least one) on every shard")
    if new_shards == shards:
        return [dict(state) for state in states[new_shard]]
    ranges = [dim0_range(shape, shards, j) for j in range(shards)]
    start, stop = dim0_range(shape, new_shards, new_shard)
    out = []
    for r in range(replicas):
        wholes = [whole_layout(states[j][r], b - a, replicas, r, name, f" (replica {r}, shard {j})")
                  for j, (a, b) in enumerate(ranges)]
        mine: dict = {}
        for key in sorted({k for w in wholes for k in w}):
            held = [w[key] for w in wholes if key in w]
            if key in COORDINATE:
                dtype = held[0].dtype
                full = np.concatenate([w[key].reshape(-1) if key in w else np.zeros(b - a, dtype)
                                       for w, (a, b) in zip(wholes, ranges)])
                mine[key] = full[start:stop].copy()
            elif _same(held):
                mine[key] = held[0]
            else:
                shown = [tuple(v.shape) if isinstance(v, np.ndarray) else v for v in held]
                raise _fail(name, f" (replica {r})", f"entry {key!r} differs across the old shards ({shown})")
        out.append(mine)
    return out


def _check_mesh(own: Mapping, who: str) -> tuple:
    """(R, S) of a gathered HSDP checkpoint, its ``'shards'`` checked to be S lists of R states."""
    mesh, shards = own.get("mesh"), own.get("shards")
    sizes = None if not isinstance(mesh, Mapping) else (mesh.get("replicas"), mesh.get("shards"))
    if sizes is None or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise ValueError(f"{who}: entry 'mesh' holds {mesh!r}; expected {{'replicas': R, 'shards': S}} "
                         "(positive integers), as state_dict(gather=True) wrote it")
    replicas, count = sizes
    if not isinstance(shards, list) or len(shards) != count or not all(
            isinstance(s, list) and len(s) == replicas for s in shards):
        held = [len(s) if isinstance(s, list) else type(s).__name__ for s in shards] \
            if isinstance(shards, list) else type(shards).__name__
        raise ValueError(f"{who}: entry 'shards' holds {held}; expected {count} lists (one per shard) of "
                         f"{replicas} replicas' states (entry 'mesh')")
    if own.get("world", replicas) != replicas:
        raise ValueError(f"{who}: entry 'world' holds {own.get('world')!r} and entry 'mesh' {replicas} "
                         "replicas; expected the same")
    for per_shard in shards:
        for states in per_shard:
            if not isinstance(states, Mapping) or not all(isinstance(st, Mapping) for st in states.values()):
                raise ValueError(f"{who}: the per-tensor state holds {type(states).__name__}; expected "
                                 "{tensor name: {key: tensor or number}}")
    return replicas, count


def _check_sizes(grid: list, shapes: Mapping[str, tuple], replicas: int, conv: Conversions, who: str) -> None:
    """Every per-rank entry of every shard's states against its shard's size (``misfit``), and
    every tensor name against this run's."""
    size = lambda v: conv.numel(v) if conv.is_tensor(v) else None   # noqa: E731
    unknown = sorted({n for per_shard in grid for states in per_shard for n in states} - set(shapes))
    if unknown:
        raise ValueError(f"{who}: compressor state for tensors this front end does not exchange: "
                         f"{unknown[:5]} (names must be the same as when it was saved)")
    for j, per_shard in enumerate(grid):
        for r, states in enumerate(per_shard):
            for name, state in states.items():
                start, stop = dim0_range(shapes[name], len(grid), j)
                bad = misfit(state, stop - start, replicas, size)
                if bad is not None:
                    raise ValueError(f"{who}: entry {bad[0]!r} of tensor {name!r} (replica {r}, shard {j}) "
                                     f"holds {bad[1]} elements; expected {bad[2]}: the state is of another "
                                     "model")


def for_shard(own: Any, conv: Conversions, params: Optional[list], shards: int, shard: int,
              who: str = "load_state_dict") -> Any:
    """What the store loads on the rank holding shard ``shard`` of ``shards``, from a checkpoint of
    the HSDP front end: a gathered one (``'mesh'`` and ``'shards'``, every rank's state) becomes
    the store's gathered checkpoint of this shard (``'ranks'``: the R old replicas' states of it,
    :func:`reshard_dim0`); one rank's (``'tensors'``) of another number of shards or another
    shard, with per-tensor state, is refused; anything else is returned as it is (the store
    checks it). ``params``: this run's ``(name, shape, dtype)`` (global shapes). A ``ValueError``
    naming the entry; nothing is changed. Local: no collective."""
    if not isinstance(own, Mapping) or "mesh" not in own:
        return own
    if "shards" not in own:
        mesh = own["mesh"]
        saved = (mesh.get("shards"), mesh.get("shard")) if isinstance(mesh, Mapping) else (None, None)
        tensors = own.get("tensors")
        if saved != (shards, shard) and isinstance(tensors, Mapping) and any(tensors.values()):
            raise ValueError(f"{who}: this checkpoint holds one rank's compressor state, of shard {saved[1]} "
                             f"of {saved[0]}, and this rank holds shard {shard} of {shards}: save it with "
                             "state_dict(gather=True) (every rank's state, the same on every rank) to resume "
                             "at another mesh, or drop its 'hvdcompress' state to start the compressor "
                             "afresh")
        return {k: v for k, v in own.items() if k != "mesh"}
    replicas, saved_shards = _check_mesh(own, who)
    rest = {k: v for k, v in own.items() if k not in ("mesh", "shards")}
    grid = own["shards"]
    shapes = None if params is None else {n: tuple(s) for n, s, _ in params}
    if params is not None:   # every shard's sizes, so that every rank refuses the same checkpoint
        _check_params(own.get("params"), params, who)
        _check_sizes(grid, shapes, replicas, conv, who)
    if saved_shards == shards:
        return {**rest, "ranks": grid[shard]}
    if params is None:
        raise ValueError(f"{who}: a checkpoint of {saved_shards} shards at {shards} shards is cut by the "
                         "parameters' shapes, which this run does not know yet")
    names = sorted({n for per_shard in grid for states in per_shard for n in states})
    ranks: list = [{} for _ in range(replicas)]
    for name in names:
        kinds, numpy = {}, []
        for per_shard in grid:
            row = []
            for states in per_shard:
                st = states.get(name, {})
                kinds.update({k: v for k, v in st.items() if conv.is_tensor(v)})
                row.append({k: conv.to_numpy(v) if conv.is_tensor(v) else v for k, v in st.items()})
            numpy.append(row)
        new = reshard_dim0(numpy, shapes[name], shards, shard, name)
        dtypes = {split_key(k)[2]: conv.dtype(v) for k, v in kinds.items()}
        like = next(iter(kinds.values()), None)
        for r, st in enumerate(new):
            ranks[r][name] = {k: conv.from_numpy(v, like, dtypes[k]) if isinstance(v, np.ndarray) else v
                              for k, v in st.items()}
    return {**rest, "ranks": ranks}


__all__ = ["COORDINATE", "dim0_range", "for_shard", "reshard_dim0", "whole_layout"]
