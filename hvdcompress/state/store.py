"""Checkpoints of the compressor state, for every front end that keeps it in tensors of its own.

What a checkpoint holds (``'hvdcompress'`` in a torch optimizer's ``state_dict``, the DDP and
FSDP states' ``state_dict``): the compressor's own state (schedules, step counters), the world
size and op of the run, and every tensor's buffers (residuals, momenta, velocities) keyed by
tensor name: this rank's (``'tensors'``), or with ``gather=True`` every rank's (``'ranks'``, host
copies, in rank order; a collective, one allgather of the state).

Every checkpoint carries its format version (:data:`FORMAT_VERSION`) and the :func:`description`
of its run (the compressor trees, the tensors' names, shapes and dtypes). Loading checks the
whole checkpoint first (:func:`check`: version, entries, compressor tree and counters, tensors,
world size, each per-rank entry's size) and builds every state it loads before it assigns
any (:func:`prepare`): a refused checkpoint raises a ``ValueError`` naming the entry, what it
holds and what was expected, and changes nothing. Then a gathered checkpoint is redistributed
to this run's world size and rank by the rule of :mod:`hvdcompress.state.reshard` (the unsent
error-feedback mass and the mean momentum are kept); one rank's checkpoint, which holds that
rank's residuals only, loads at the same world size and is refused at another one with a
``ValueError`` that says how to save one that resumes anywhere.

The framework enters through :class:`Conversions` (copies, the host, numpy, dtypes).
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np

from ..transport.objects import allgather_object
from .reshard import has_per_rank, misfit, share_of_rank, split_key


@dataclass(frozen=True)
class Conversions:
    """How a framework's tensors are copied and moved for checkpoints.

    ``is_tensor(v)``; ``copy(v, like)``: a copy on ``like``'s device (None: ``v``'s);
    ``host(v)``: a copy on the host, picklable; ``to_numpy(v)``: a host array (a dtype numpy lacks, as float32);
    ``from_numpy(a, like, dtype)``: a tensor of ``dtype`` on ``like``'s device; ``dtype(v)``;
    ``numel(v)``: its number of elements.
    """

    is_tensor: Callable[[Any], bool]
    copy: Callable[[Any, Any], Any]
    host: Callable[[Any], Any]
    to_numpy: Callable[[Any], np.ndarray]
    from_numpy: Callable[[np.ndarray, Any, Any], Any]
    dtype: Callable[[Any], Any]
    numel: Callable[[Any], int]


def copied(tensors: Mapping[str, Mapping], copy: Callable[[Any], Any], is_tensor: Callable[[Any], bool]) -> dict:
    """name -> {key: copy(tensor) or the value as it is}."""
    return {name: {k: copy(v) if is_tensor(v) else v for k, v in st.items()} for name, st in tensors.items()}


def cloned(tensors: Mapping[str, Mapping], conv: Conversions) -> dict:
    """A copy of per-tensor states, each tensor on its own device."""
    return copied(tensors, lambda v: conv.copy(v, None), conv.is_tensor)


#: the checkpoint format :func:`save` writes (its ``'version'`` entry); :func:`check` reads it
#: and version 0, the checkpoints written before the entry existed
FORMAT_VERSION = 1
#: the entries a checkpoint of each version must hold, besides ``'tensors'`` or ``'ranks'``
ENTRIES = {0: ("compressor",), 1: ("compressor", "compression", "world", "average")}


def description(driver: Any) -> dict:
    """What a checkpoint of ``driver``'s run is saved with and must match to load into one:
    the compressor trees (their reprs, :meth:`hvdcompress.contract.compressor.Compressor.__repr__`)
    and the tensors exchanged, ``(name, shape, dtype)`` (None while the front end does not know
    them yet, :meth:`hvdcompress.step.driver.StepDriver.describe`)."""
    return {"compression": repr(driver.compressor), "intra_node": repr(driver.options.intra_node),
            "params": driver.tensors}


def save(driver: Any, conv: Conversions, gather: bool, like: Any) -> dict:
    """The ``'hvdcompress'`` entry of a checkpoint from ``driver`` (:class:`hvdcompress.step.driver.StepDriver`):
    the format version, the :func:`description`, then one rank's state, or with ``gather`` every
    rank's (a collective over the driver's ranks; ``like``: a tensor on the device the bytes
    travel from)."""
    own = {"version": FORMAT_VERSION, **description(driver), "compressor": driver.compressor.state_dict(),
           "world": driver.comm.world, "average": driver.options.average}
    tensors = driver.states.named()
    if gather:
        own["ranks"] = allgather_object(copied(tensors, conv.host, conv.is_tensor), driver.comm, driver.ops, like)
    else:
        own["tensors"] = cloned(tensors, conv)
    return own


def check_entries(own: Any, expected: Mapping[str, Any], counters: Mapping[str, Any], who: str) -> None:
    """The format of a checkpoint ``own``, checked whole: a ``ValueError`` naming
    the entry, what it holds and what was expected, for: ``own`` not a dict; an unknown
    ``'version'``; a missing entry of :data:`ENTRIES`, or neither ``'tensors'`` nor ``'ranks'``;
    an entry of ``expected`` (:func:`description`) that the checkpoint holds otherwise (skipped
    where either side is None); ``'compressor'`` without the keys of this compressor's
    ``counters`` (its ``state_dict()``), or with a non-number where it has a number.

    Version 0 (no ``'version'`` entry: written before it existed) is accepted with the checks
    its entries allow: it holds neither the compressor trees nor the tensors' shapes, so a
    compressor of other counters is refused, one of the same counters (top-k for PowerSGD) is not."""
    if not isinstance(own, Mapping):
        raise ValueError(f"{who}: the compressor checkpoint is a {type(own).__name__}; expected "
                         "the dict that state_dict() returned")
    version = own.get("version", 0)
    if isinstance(version, bool) or version not in ENTRIES:
        raise ValueError(f"{who}: entry 'version' holds {version!r}; this hvdcompress reads "
                         f"versions {sorted(ENTRIES)} (0: written before the entry existed)")
    missing = [repr(k) for k in ENTRIES[version] if k not in own]
    missing += [] if "tensors" in own or "ranks" in own else ["'tensors' (one rank's) or 'ranks' (every rank's)"]
    if missing:
        raise ValueError(f"{who}: the checkpoint (version {version}) lacks {', '.join(missing)}; it holds "
                         f"{sorted(map(str, own))}; expected the dict that state_dict() returned")
    for entry, want in expected.items():
        held = own.get(entry)
        if entry == "params":
            _check_params(held, want, who)
        elif held is not None and want is not None and held != want:
            raise ValueError(f"{who}: entry {entry!r} holds {held} and this run has {want}; the state "
                             "belongs to the compressor that made it: load it into the same one, or "
                             "leave it unloaded to start the compressor afresh")
    saved = own["compressor"]
    if not isinstance(saved, Mapping) or set(saved) != set(counters) or any(
            isinstance(counters[k], Real) and not isinstance(saved[k], Real) for k in counters):
        raise ValueError(f"{who}: entry 'compressor' holds {saved!r}; expected this compressor's "
                         f"counters {dict(counters)!r} (the same keys, numbers): the checkpoint is "
                         "of another compressor")


def _shape_and_dtype(row: Optional[tuple]) -> str:
    return "absent" if row is None else f"shape {tuple(row[0])}, dtype {row[1]}"


def _check_params(saved: Any, expected: Optional[list], who: str) -> None:
    """The checkpoint's tensors ``(name, shape, dtype)`` against this run's (either None: not
    known, skipped); a ``ValueError`` naming the first parameter that differs."""
    if saved is None or expected is None:
        return
    if not isinstance(saved, (list, tuple)) or not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in saved):
        raise ValueError(f"{who}: entry 'params' holds {saved!r}; expected a list of (name, shape, dtype)")
    held = {name: (tuple(shape), dtype) for name, shape, dtype in saved}
    here = {name: (tuple(shape), dtype) for name, shape, dtype in expected}
    for name in sorted(set(held) | set(here)):
        if held.get(name) != here.get(name):
            raise ValueError(f"{who}: entry 'params' holds parameter {name!r} with "
                             f"{_shape_and_dtype(held.get(name))} and this run has {_shape_and_dtype(here.get(name))}; "
                             "the compressor state is kept per parameter: load a checkpoint of this model")


def _per_tensor(own: Mapping, who: str) -> list:
    """Every rank's states in the checkpoint (one rank's: a list of one), checked to be
    ``{tensor name: {key: value}}``, as many as its ``'world'`` for a gathered one."""
    ranks = own["ranks"] if "ranks" in own else [own["tensors"]]
    if "ranks" in own and (not isinstance(ranks, list) or len(ranks) != own.get("world", len(ranks))):
        held = f"a list of {len(ranks)}" if isinstance(ranks, list) else f"a {type(ranks).__name__}"
        raise ValueError(f"{who}: entry 'ranks' holds {held}; expected a list of {own.get('world')} "
                         "ranks' states (entry 'world')")
    for states in ranks:
        if not isinstance(states, Mapping) or not all(isinstance(st, Mapping) for st in states.values()):
            raise ValueError(f"{who}: the per-tensor state holds {type(states).__name__}; expected "
                             "{tensor name: {key: tensor or number}}")
    return ranks


def check(driver: Any, own: Any, conv: Conversions, known: Optional[Iterable[str]],
          layout: Optional[Callable[[str], tuple]], who: str = "load_state_dict") -> None:
    """Check the whole checkpoint ``own`` (:func:`save`'s) against ``driver``'s run before
    anything is loaded: its format (:func:`check_entries`), then its tensors: a name this front
    end keeps no state under (``known``; None: not known yet), one rank's checkpoint at another
    world size, a per-rank entry whose size does not follow its tensor's (``layout(name)`` ->
    ``(numel, like, ...)`` with ``like`` None where the tensor is not known yet; ``layout``
    None: not checked). Local: no collective."""
    check_entries(own, description(driver), driver.compressor.state_dict(), who)
    ranks = _per_tensor(own, who)
    names = sorted({name for states in ranks for name in states})
    unknown = [] if known is None else sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"{who}: compressor state for tensors this front end does not exchange: "
                         f"{unknown[:5]} (names must be the same as when it was saved)")
    world, saved_world = driver.comm.world, own.get("world", driver.comm.world)
    if "ranks" not in own and saved_world != world and any(has_per_rank(st) for st in ranks[0].values()):
        raise ValueError(f"{who}: this checkpoint holds one rank's compressor state (residuals, "
                         f"momenta) of a run at {saved_world} ranks, and this run has {world}; save "
                         "it with state_dict(gather=True) to resume at another world size, or drop "
                         "its 'hvdcompress' state to start the compressor afresh")
    for name in names if layout is not None else ():
        numel, like = layout(name)[:2]
        for index, states in enumerate(ranks if like is not None else ()):
            bad = misfit(states.get(name, {}), numel, saved_world, lambda v: conv.numel(v) if conv.is_tensor(v) else None)
            if bad is not None:
                where = "" if "ranks" not in own else f" of rank {index}"
                raise ValueError(f"{who}: entry {bad[0]!r} of tensor {name!r}{where} holds {bad[1]} "
                                 f"elements; expected {bad[2]}: the state is of another model")


def prepare(driver: Any, own: Any, conv: Conversions, known: Optional[Iterable[str]],
            layout: Callable[[str], tuple], who: str = "load_state_dict") -> Callable[[], None]:
    """Check the whole checkpoint (:func:`check`) and build every state it loads, changing
    nothing; return the load itself, which only assigns (the compressor's counters, each
    tensor's state), so that a front end that also loads another state (the wrapped
    optimizer's) loads it between the two and a refused checkpoint changes nothing.
    ``layout(name)`` -> ``(numel, like, alltoall)``: the tensor's size, a tensor on its device,
    and a callable telling whether the engine runs it as a compressed allreduce (asked only for a
    gathered checkpoint with state). A gathered checkpoint is redistributed to this run's world
    size and rank (:mod:`hvdcompress.state.reshard`). Local: no collective."""
    check(driver, own, conv, known, layout, who)
    counters, world, rank = dict(own["compressor"]), driver.comm.world, driver.comm.rank
    new: dict = {}
    if "ranks" not in own:
        for name, st in own["tensors"].items():
            like = layout(name)[1]
            new[name] = {k: conv.copy(v, like) if conv.is_tensor(v) else v for k, v in st.items()}
    for name in sorted({n for r in own.get("ranks", ()) for n in r}):
        numel, like, alltoall = layout(name)
        per_rank = [r.get(name, {}) for r in own["ranks"]]
        dtypes = {split_key(k)[2]: conv.dtype(v) for st in per_rank for k, v in st.items() if conv.is_tensor(v)}
        states = [{k: conv.to_numpy(v) if conv.is_tensor(v) else v for k, v in st.items()} for st in per_rank]
        shared = share_of_rank(states, numel, world, rank, driver.options.average, own.get("average"),
                               alltoall, who)
        new[name] = {k: conv.from_numpy(v, like, dtypes[split_key(k)[2]])
                     if isinstance(v, np.ndarray) else v for k, v in shared.items()}

    def commit() -> None:
        driver.compressor.load_state_dict(counters)
        for name, state in new.items():
            driver.states[name] = state
    return commit


def load(driver: Any, own: Any, conv: Conversions, known: Optional[Iterable[str]],
         layout: Callable[[str], tuple], who: str = "load_state_dict") -> None:
    """Load :func:`save`'s output into ``driver``'s states, all or nothing (:func:`prepare`)."""
    prepare(driver, own, conv, known, layout, who)()
