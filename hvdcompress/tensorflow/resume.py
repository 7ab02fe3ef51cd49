"""Compressor state at another world size on TensorFlow / Keras: gather it, load it at P' ranks.

The TF twin of the torch optimizer's ``state_dict(gather=True)`` / ``load_state_dict``; the rule is
:mod:`hvdcompress.state.reshard`'s (numpy), the same for both front ends::

    T = Σ_r e_r  (+ the compressed allreduce's server residuals)     (float64)
    e'_r' = T / P   for every new rank r'    (op=Average:  Σ_r' e'_r' / P' = T / P = Σ_r e_r / P)
    e'_r' = T / P'  for every new rank r'    (op=Sum:      Σ_r' e'_r' = T)

for the per-rank additive state (residuals, momenta, velocities), rank 0's value for the
replicated one (FrozenAdam's moments, PowerSGD's warm start, counters); see docs/elastic.md.

::

    saved = hvc.gather_compression_state(opt)      # every rank: one allgather
    if hvd.rank() == 0:
        np.save / pickle.dump({"weights": model.get_weights(), "compression": saved}, ...)
    ...                                            # at P' ranks, every rank:
    hvc.load_compression_state(opt, saved)         # local; laid out at the next exchange

``target`` is an hvdcompress Keras ``DistributedOptimizer``, a ``DistributedGradientTape`` (its
exchange), or the compressor given to the tapes (or its :class:`CompressionState`). Loading is
lazy: the next exchange lays each tensor's share out for its world size and its collective
(the compressed allreduce's P' segments, or the whole tensor), so nothing about the new run
needs to be repeated here; pass ``variables=`` with an optimizer or tape to lay it out at once.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..contract.compressor import Compressor
from ..ops.tf_ops import TFOps
from ..state.reshard import share_of_rank
from ..state.store import FORMAT_VERSION, check_entries
from ..transport.objects import allgather_object
from .collectives import HorovodCollectives
from .gradients import source_names
from .state import CompressionState, Loaded, compression_state

OPS = TFOps()


def _resolve(target: Any) -> Tuple[CompressionState, Any]:
    """(the compression state, the exchange or None) of ``target``."""
    exchange = getattr(target, "_hvdc_exchange", None) or getattr(target, "exchange", None)
    if exchange is not None and hasattr(exchange, "state") and hasattr(exchange, "driver"):
        return exchange.state, exchange
    if isinstance(target, Compressor):
        return compression_state(target), None
    if isinstance(target, CompressionState):
        return target, None
    raise TypeError(f"target={target!r}: allowed: an hvdcompress.tensorflow.keras.DistributedOptimizer, "
                    "an hvdcompress DistributedGradientTape, the hvdcompress Compressor given to the "
                    "tapes, or its CompressionState")


def _value(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str, type(None))) else np.array(v)


def gather_compression_state(target: Any) -> dict:
    """Every rank's compressor state, for a checkpoint that resumes at any world size.

    A collective: every rank of the exchange's process set calls it (one allgather of the
    pickled state). Returns ``{"version": 1, "compression": the compressor tree (its repr),
    "compressor": counters, "world": P, "average": op is Average, "ranks": [rank r's {tensor
    name: {key: numpy array or number}} for r < P]}`` (the format of
    :mod:`hvdcompress.state.store`), the same on every rank; rank 0 writes it."""
    state, exchange = _resolve(target)
    state.pull()   # counters a checkpoint restore put in the variables
    ps = exchange.options.process_set if exchange is not None else (state.process_set or hvd.global_process_set)
    mine = {name: {k: _value(st[k]) for k in st} for name, st in state.named().items()}
    ranks = allgather_object(mine, HorovodCollectives(ps), OPS, tf.zeros([1]))
    average = exchange.core.average if exchange is not None else state.average
    return {"version": FORMAT_VERSION, "compression": repr(state.compressor),
            "compressor": state.compressor.state_dict(), "world": len(ranks), "average": average, "ranks": ranks}


def load_compression_state(target: Any, saved: dict, variables: Optional[Sequence[Any]] = None) -> None:
    """Load a :func:`gather_compression_state` of a run at any world size. Local: no collective.

    The compressor's counters are loaded now; each tensor's state is replaced by this rank's
    share (:func:`hvdcompress.state.reshard.redistribute`) at the next exchange that sees the tensor,
    laid out for that exchange's world and collective, or at once for ``variables`` (with an
    optimizer or tape as ``target``). A state gathered with op=Average loaded into an exchange
    with op=Sum (or the reverse) raises a ``ValueError`` there. The format is checked whole
    first (:func:`hvdcompress.state.store.check_entries`: version, entries, the compressor tree
    and counters; a state without a ``'version'`` is version 0, checked as far as its entries
    allow); a refused one (a ``ValueError`` naming the entry) changes nothing."""
    if not isinstance(saved, dict) or not isinstance(saved.get("ranks"), list) or "compressor" not in saved:
        raise ValueError("load_compression_state: saved must be what gather_compression_state returned "
                         "(a dict with 'compressor' and 'ranks'); a single rank's state cannot be "
                         "laid out for another world size")
    state, exchange = _resolve(target)
    check_entries(saved, {"compression": repr(state.compressor)}, state.compressor.state_dict(),
                  "load_compression_state")
    if variables is not None and exchange is None:
        raise ValueError(f"load_compression_state: variables= with target={target!r}: allowed only "
                         "with a DistributedOptimizer or DistributedGradientTape (their exchange "
                         "knows the layout); without variables= the next exchange lays it out")
    state.compressor.load_state_dict(saved["compressor"])
    state.push()
    state.loaded = Loaded(saved)
    if variables is not None:
        lay_out(exchange, list(variables))


def lay_out(exchange: Any, sources: Sequence[Any]) -> None:
    """Lay a gathered state loaded with :func:`load_compression_state` out for this run's world
    now, for ``exchange``'s variables ``sources`` (as given to ``apply_gradients`` /
    ``tape.gradient``); otherwise the next exchange does it. Local."""
    if exchange.built_for != exchange.state.generation:
        exchange.rebuild()
    names = source_names(sources)
    pairs = [(n, s) for n, s in zip(names, sources) if hasattr(s, "assign") and id(s) not in exchange.local]
    infos = [exchange._info(n, s, s) for n, s in pairs]
    dtypes = [s.dtype for _, s in pairs]
    stated = exchange._stated(exchange._bundles(infos, [s for _, s in pairs], dtypes), dtypes, infos)
    exchange._init_states(*stated)
    apply_loaded(exchange, *stated)


def apply_loaded(exchange: Any, dtypes: list, infos: list) -> None:
    """This rank's share of a loaded gathered state for each tensor of ``infos`` that it holds
    (:func:`hvdcompress.state.reshard.share_of_rank`), once, at the first exchange after the load."""
    state = exchange.state
    loaded = state.loaded
    if loaded is None:
        return
    ps = exchange.options.process_set
    for dtype, info in zip(dtypes, infos):
        if info.name not in loaded.left:
            continue
        states = [per_rank.get(info.name, {}) for per_rank in loaded.saved["ranks"]]
        new = share_of_rank(states, info.numel, ps.size(), ps.rank(), exchange.core.average,
                            loaded.saved.get("average"), lambda: exchange.engine.collective_for(
                                info, tf.zeros([info.numel], dtype)) == "alltoall", "load_compression_state")
        state.tensor(info.name).replace(new)
        loaded.left.discard(info.name)
    if not loaded.left:
        state.loaded = None
