"""The TensorFlow side of the exchange: the engine behind
:func:`~hvdcompress.tensorflow.DistributedGradientTape` and the Keras ``DistributedOptimizer``.

The algorithm of one step (compress, allreduce / allgather / compressed allreduce, decode,
scale) is the core's :class:`hvdcompress.exchange.Exchange`, the same as for torch; this module
keeps what is TensorFlow's: variables as state, IndexedSlices, ``None`` gradients, the local
clip, graph mode, and Horovod's TF collectives (:mod:`.collectives`).

Only Horovod's collective ops are used (not its tape, optimizer or Keras code), so this works
with Keras 2 and Keras 3 alike.

Graph mode: the core's algorithms take Python decisions on tensor values (DGC's adaptive
threshold loop, random-k's seeded host-side index draw, counts as Python ints) and the payload
layout may change from step to step (DGC sends dense during warm-up). Inside a ``tf.function``
the whole exchange therefore runs as one ``tf.py_function``: the same eager code as in eager
mode, hence the same results as the torch path, and nothing about sparsity, step or epoch is
baked into the graph, so changing them never retraces. The price: one host round trip per step
and no XLA (``jit_compile=True``) for the training step.

IndexedSlices gradients (embeddings): with ``sparse_as_dense=True``, or when the compressor
takes the optimizer's momentum over (it needs every row), they are densified and compressed.
Otherwise they are passed through uncompressed, as Horovod does: values and indices are
allgathered (and divided by N for op=Average).

``None`` gradients stay ``None`` and are not communicated (as in Horovod's TensorFlow API).

Loss scaling (:mod:`hvdcompress.loss_scale`): with ``scaler=`` (a Keras ``LossScaleOptimizer``)
every gradient is multiplied by 1/s, s the scaler's current loss scale, before anything else
(the local clip, error feedback, compression), by the scaler's own
``get_unscaled_gradients``. With ``scaler=``, or when the Keras optimizer wraps a
``LossScaleOptimizer`` (whose gradients arrive unscaled), each rank's overflow flag (1 where any
gradient holds an inf or NaN) is summed over the ranks before the exchange
(:func:`~hvdcompress.loss_scale.any_overflow`); if any rank overflowed, nothing is compressed
or sent, the compressor state and counters stay as they were on every rank, and every
exchanged gradient comes back NaN, so the ``LossScaleOptimizer`` skips the step and lowers its
scale on every rank alike.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..accounting import ByteCount
from ..agreement import check_ranks_agree
from ..adam import AdamSettings
from ..clipping import local_clip_limit
from ..compressor import TensorInfo
from ..loss_scale import any_overflow
from ..collectives import Planner
from ..fusion import bucket_info, compress_bucket, totals as fused_totals
from ..options import Options, parse_options
from ..replicas import ReplicaCheck, counters_checksum
from ..reshard import share_of_rank
from ..two_level import build_exchange
from .backend import TFOps
from .collectives import HorovodCollectives
from .state import compression_state

OPS = TFOps()
#: One replica guard per compressor state: the tape, and its exchange, are created every step.
_CHECKS: "weakref.WeakKeyDictionary[Any, ReplicaCheck]" = weakref.WeakKeyDictionary()
#: The compressor states whose ranks have been checked to agree (once, at the first exchange).
_AGREED: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ExchangeOptions:
    """The TF front end's arguments: the shared ones (:class:`hvdcompress.options.Options`,
    ``core``) and TensorFlow's own."""

    core: Options
    device_dense: str = ""
    device_sparse: str = ""
    process_set: Any = hvd.global_process_set
    scale_local: bool = True   # divide local gradients by the number of ranks (Horovod's default)


def loss_scale_optimizers() -> tuple:
    """The Keras loss scalers ``scaler=`` takes: Keras 2's ``LossScaleOptimizer`` (its
    ``get_unscaled_gradients`` unscales, its ``apply_gradients`` takes unscaled gradients)."""
    return (tf.keras.mixed_precision.LossScaleOptimizer,)


def is_loss_scale_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras ``LossScaleOptimizer``."""
    return isinstance(optimizer, loss_scale_optimizers())


def exchange_options(compression: Any = None, device_dense: str = "", device_sparse: str = "",
                     process_set: Any = hvd.global_process_set, op: Any = hvd.Average,
                     scaler: Any = None, scale_local_gradients: bool = True,
                     **kwargs: Any) -> ExchangeOptions:
    """:class:`ExchangeOptions` from Horovod's keyword arguments and hvdcompress's, each checked
    once (:func:`hvdcompress.options.parse_options`; the deprecated ``num_groups`` folded into
    ``groups``, as Horovod does, with a DeprecationWarning)."""
    if is_loss_scale_optimizer(scaler) and not hasattr(scaler, "get_unscaled_gradients"):
        raise ValueError(f"scaler={scaler!r}: allowed: None or a Keras 2 "
                         "tf.keras.mixed_precision.LossScaleOptimizer (one with "
                         "get_unscaled_gradients; Keras 3's unscales inside apply_gradients, "
                         "which the tape's scaler= does not support yet)")
    for key, value in (("device_dense", device_dense), ("device_sparse", device_sparse)):
        if not isinstance(value, str):
            raise ValueError(f"{key}={value!r}: allowed: a device string such as '/cpu:0' or '' "
                             "(Horovod's default)")
    if not isinstance(scale_local_gradients, bool):
        raise ValueError(f"scale_local_gradients={scale_local_gradients!r}: allowed: True or False")
    if not isinstance(process_set, hvd.ProcessSet):
        raise ValueError(f"process_set={process_set!r}: allowed: a horovod ProcessSet "
                         "(default hvd.global_process_set)")
    core = parse_options(compression, op=op, average_op=hvd.Average, sum_op=hvd.Sum,
                         process_set=process_set, global_set=hvd.global_process_set,
                         scaler=scaler, scaler_types=loss_scale_optimizers(), **kwargs)
    return ExchangeOptions(core, device_dense, device_sparse, process_set, scale_local_gradients)


def source_names(sources: Sequence[Any]) -> list:
    """Stable, unique names of the gradient sources (variable paths; positions otherwise)."""
    names = []
    for i, s in enumerate(sources):
        name = None
        if hasattr(s, "assign"):  # a variable: Keras 3 has a unique path, TF and Keras 2 a name
            name = getattr(s, "path", None) or getattr(s, "name", None)
        names.append(name.split(":")[0] if name else f"source.{i}")
    counts = {n: names.count(n) for n in names}
    return [f"{n}.{i}" if counts[n] > 1 else n for i, n in enumerate(names)]


def overflow_flag(grads: Sequence[Any]) -> tf.Tensor:
    """This rank's overflow flag, shape [1] float32: 1 when any of ``grads`` (None skipped,
    IndexedSlices by their values) holds an inf or NaN, else 0."""
    checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
              for g in grads if g is not None]
    finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
    return tf.reshape(tf.cast(tf.logical_not(finite), tf.float32), [1])


class GradientExchange:
    """Compresses, communicates and averages gradients with one compressor and fixed options.

    ``momentum`` / ``nesterov``: the wrapped optimizer's settings that the compressor takes over
    (:attr:`~hvdcompress.Compressor.takes_over_momentum`); handed to it in :class:`TensorInfo`.
    ``last_step_bytes`` / ``total_bytes``: this rank's dense versus sent bytes.
    ``overflow_check``: ask every rank whether any gradient overflowed before compressing (see
    the module doc; on with ``scaler=`` in the options, and for the Keras optimizer around a
    ``LossScaleOptimizer``).
    """

    def __init__(self, options: ExchangeOptions, momentum: float = 0.0, nesterov: bool = False,
                 adam_settings: Optional[Callable[[], AdamSettings]] = None,
                 overflow_check: bool = False):
        compressor = options.core.compressor
        if getattr(compressor, "takes_over_adam", False) and adam_settings is None:
            raise ValueError(f"compression={compressor!r}: the Adam take-over (FrozenAdam) replaces "
                             "the optimizer's step, so it runs on hvdcompress.torch."
                             "DistributedOptimizer and hvdcompress.tensorflow.keras."
                             "DistributedOptimizer (around a Keras Adam or AdamW), not on the tape, "
                             "whose gradients your own optimizer applies")
        self.adam_settings = adam_settings   # the Keras optimizer's Adam settings, read each step
        self.compressor = compressor
        self.options = options
        self.core = core = options.core
        self.momentum = momentum
        self.nesterov = nesterov
        self.state = compression_state(compressor)
        self.state.process_set, self.state.average = options.process_set, core.average
        self._build()
        self.local: dict = {}   # id -> variable whose gradient stays this rank's own
        self.scaler = core.scaler   # the Keras LossScaleOptimizer of scaler= (hvdcompress.loss_scale)
        self.checks_overflow = overflow_check or self.scaler is not None

    def _build(self) -> None:
        """The engine for Horovod's current world (and the replica guard, one per state)."""
        options, core = self.options, self.core
        self.engine = build_exchange(hvd, lambda ps: HorovodCollectives(ps, options.device_dense),
                                     options.process_set, self.compressor, OPS,
                                     intra_node=core.intra_node, ranks_per_node=core.ranks_per_node,
                                     average=core.average, predivide=core.predivide,
                                     collective=core.collective)
        self.built_for = self.state.generation
        if self.state not in _CHECKS:
            ps = options.process_set
            _CHECKS[self.state] = ReplicaCheck(core.check_replicas, OPS,
                                               HorovodCollectives(ps, options.device_dense),
                                               ranks=getattr(ps, "ranks", None))
        self.replicas = _CHECKS[self.state]
        self.replicas.every = core.check_replicas

    def rebuild(self) -> None:
        """Rebuild for Horovod's current world after ``hvd.shutdown(); hvd.init()`` at another
        size (an elastic reset, :mod:`hvdcompress.tensorflow.elastic`): a new engine (every
        tensor's collective planned again for the new number of ranks), the replica guard, and
        the rank agreement again at the next exchange (a collective: a joining rank makes it at
        its first exchange too). The compressor state is laid out by
        :func:`hvdcompress.tensorflow.load_compression_state`. Runs by itself at the first
        exchange after the state's ``generation`` changed."""
        if self.options.process_set is not hvd.global_process_set or self.core.intra_node is not None:
            raise ValueError("rebuild: this exchange runs over a process set (or two-level "
                             "compression's node sets), which does not survive hvd.shutdown(); "
                             "elastic training needs the global process set and intra_node=None")
        if isinstance(self.compressor, Planner):
            raise ValueError("rebuild: compression='auto' plans for one world size and link; "
                             "elastic training needs a fixed compressor")
        total = self.engine.total_bytes
        _CHECKS.pop(self.state, None)
        _AGREED.pop(self.state, None)
        self._build()
        self.engine.total_bytes = total

    def lay_out(self, sources: Sequence[Any]) -> None:
        """Lay a gathered state loaded with :func:`hvdcompress.tensorflow.load_compression_state`
        out for this run's world now, for the variables ``sources`` (as given to
        ``apply_gradients`` / ``tape.gradient``); otherwise the next exchange does it. Local."""
        if self.built_for != self.state.generation:
            self.rebuild()
        names = source_names(sources)
        pairs = [(n, s) for n, s in zip(names, sources) if hasattr(s, "assign") and id(s) not in self.local]
        infos = [self._info(n, s, s) for n, s in pairs]
        dtypes = [s.dtype for _, s in pairs]
        stated = self._stated(self._bundles(infos, [s for _, s in pairs], dtypes), dtypes, infos)
        self._init_states(*stated)
        self._apply_loaded(*stated)

    def _apply_loaded(self, dtypes: list, infos: list) -> None:
        """This rank's share of a loaded gathered state for each tensor of ``infos`` that it
        holds (:func:`hvdcompress.reshard.share_of_rank`)."""
        loaded = self.state.loaded
        if loaded is None:
            return
        saved, average = loaded.saved, self.core.average
        ps = self.options.process_set
        for dtype, info in zip(dtypes, infos):
            if info.name not in loaded.left:
                continue
            states = [per_rank.get(info.name, {}) for per_rank in saved["ranks"]]
            new = share_of_rank(states, info.numel, ps.size(), ps.rank(), average, saved.get("average"),
                                lambda: self.engine.collective_for(info, tf.zeros([info.numel], dtype)) == "alltoall",
                                "load_compression_state")
            self.state.tensor(info.name).replace(new)
            loaded.left.discard(info.name)
        if not loaded.left:
            self.state.loaded = None

    def register_local(self, variable: Any) -> None:
        """Keep ``variable``'s gradient local: not exchanged, clipped or checked across ranks
        (Horovod's ``register_local_var`` / ``register_local_source``: e.g. a per-rank head);
        divided by the number of ranks with ``scale_local_gradients=True`` (the default)."""
        if self.adam_settings is not None:
            raise ValueError("register_local_var with the Adam take-over (FrozenAdam): the exchange "
                             "updates the variables itself, so a local variable would not be "
                             "updated; use a compressor without FrozenAdam")
        self.local[id(variable)] = variable

    # ---- entry point --------------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert  # plain Python on Python values: nothing to convert
    def __call__(self, grads: Sequence[Any], sources: Sequence[Any]) -> list:
        """The averaged (or summed) gradients, in the structure of ``grads`` (None kept). With the
        Adam take-over (``adam_settings``) the variables are updated here, and what is returned
        is the exchanged gradient (warm-up) or momentum (after the freeze).

        On a rank outside the process set: its own gradients, untouched, with no collective
        (as Horovod does); the same for the sources registered as local (:meth:`register_local`).
        With ``scaler=`` every gradient is unscaled first (the module doc)."""
        if self.scaler is not None:   # Keras's own unscale: g * (1/s), IndexedSlices included
            grads = list(self.scaler.get_unscaled_gradients(list(grads)))
        if not self.options.process_set.included():
            return list(grads)
        flag = overflow_flag(grads) if self.checks_overflow else None
        local = [i for i, s in enumerate(sources) if id(s) in self.local]
        if not local:
            return self._shared(grads, sources, flag)
        out = self._shared([None if i in local else g for i, g in enumerate(grads)], sources, flag)
        for i in local:
            out[i] = self._scaled_local(grads[i]) if self.options.scale_local else grads[i]
        return out

    def _scaled_local(self, grad: Any) -> Any:
        """A local gradient divided by the process set's size (Horovod's
        ``scale_local_gradients=True``: a local variable moves as if its gradient had been
        averaged with zeros). The size is read when the step runs: an elastic world may change."""
        if grad is None:
            return None
        n = hvd.size_op(process_set_id=self.options.process_set.process_set_id)
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                    grad.dense_shape)
        return grad / tf.cast(n, grad.dtype)

    def _shared(self, grads: Sequence[Any], sources: Sequence[Any], flag: Any = None) -> list:
        """The exchange of ``grads`` with ``clip_grad_norm`` before or after it (None kept)."""
        c = self.core.clip_grad_norm
        if c is None:
            return self._reduce(grads, sources, flag)
        if self.core.clip_before:
            limit = local_clip_limit(c, self.options.process_set.size(), average=self.core.average,
                                     compressor=self.compressor)
            return self._reduce(self._clip(grads, limit), sources, flag)
        return self._clip(self._reduce(grads, sources, flag), c)

    def _reduce(self, grads: Sequence[Any], sources: Sequence[Any], flag: Any = None) -> list:
        """The exchange of ``grads`` (see :meth:`__call__`); ``flag``: this rank's overflow flag
        (:func:`overflow_flag`), or None without the overflow check."""
        names = source_names(sources)
        variables = sorted(((n, s) for n, s in zip(names, sources)
                            if hasattr(s, "assign") and id(s) not in self.local),
                           key=lambda pair: pair[0])
        out = list(grads)
        dense = []
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                if not (self.core.sparse_as_dense or self.compressor.takes_over_momentum
                        or self.adam_settings is not None):
                    out[i] = self._gather_slices(g, names[i])
                    continue
                out[i] = tf.convert_to_tensor(g)
            if out[i] is not None:
                dense.append(i)
        if not dense:
            return out
        infos = [self._info(names[i], sources[i], out[i]) for i in dense]
        params = [sources[i] if hasattr(sources[i], "assign") else None for i in dense]
        inputs = [out[i] for i in dense]
        dtypes = [g.dtype for g in inputs]
        self._init_states(*self._stated(self._bundles(infos, params, dtypes), dtypes, infos))
        if tf.executing_eagerly():
            reduced = self._exchange(inputs, params, infos, variables, flag)
        elif flag is None:
            reduced = tf.py_function(lambda *g: self._exchange(list(g), params, infos, variables), inputs,
                                     Tout=[g.dtype for g in inputs])
        else:
            reduced = tf.py_function(lambda f, *g: self._exchange(list(g), params, infos, variables, f),
                                     [flag] + inputs, Tout=[g.dtype for g in inputs])
            for r, g in zip(reduced, inputs):
                r.set_shape(g.shape)
        for i, r in zip(dense, reduced):
            out[i] = r
        return out

    # ---- pieces ---------------------------------------------------------------------------------
    def _bundles(self, infos: list, params: list, dtypes: list) -> list:
        """``(bucket, positions)`` of the exchanged gradients, one per grouped collective, in
        name order (:meth:`hvdcompress.options.Options.group_ids`); ``bucket``: the
        :class:`hvdcompress.fusion.Bucket` compressed as one with ``fusion=``, else None."""
        fused = self.core.buckets([(info.name, info.numel, info.numel * tf.as_dtype(dtype).size,
                                    tf.as_dtype(dtype).name) for info, dtype in zip(infos, dtypes)])
        if fused:
            bucket_of = {m: b for b in fused for m in b.members}
            ids = {info.name: bucket_of[info.name].name if info.name in bucket_of else info.name
                   for info in infos}
        else:
            names = {id(p): info.name for info, p in zip(infos, params) if p is not None}
            ids = self.core.group_ids([info.name for info in infos], lambda v: names.get(id(v)))
        bundles: dict = {}
        for i in sorted(range(len(infos)), key=lambda i: infos[i].name):
            bundles.setdefault(ids[infos[i].name], []).append(i)
        by_name = {b.name: b for b in fused}
        return [(by_name.get(gid), positions) for gid, positions in bundles.items()]

    @staticmethod
    def _clip(grads: Sequence[Any], limit: float) -> list:
        """``grads`` (None kept) scaled together to a global L2 norm of at most ``limit``
        (``tf.clip_by_global_norm``)."""
        out = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, _ = tf.clip_by_global_norm([grads[i] for i in present], limit)
        for i, g in zip(present, clipped):
            out[i] = g
        return out

    def _info(self, name: str, source: Any, grad: Any) -> TensorInfo:
        static = tf.TensorShape(source.shape)  # Keras 3 variables give a tuple
        shape = tf.TensorShape(static if static.is_fully_defined() else grad.shape)
        return TensorInfo(name=name, numel=shape.num_elements(),
                          world=self.options.process_set.size(), rank=self.options.process_set.rank(),
                          shape=tuple(shape),
                          momentum=self.momentum, nesterov=self.nesterov)

    @staticmethod
    def _stated(bundles: list, dtypes: list, infos: list) -> tuple:
        """``(dtypes, infos)`` of what keeps a state, from :meth:`_bundles`: each tensor, or its
        fused bucket."""
        out_dtypes, out_infos = [], []
        for bucket, positions in bundles:
            out_dtypes += [dtypes[i] for i in positions] if bucket is None else [dtypes[positions[0]]]
            out_infos += [infos[i] for i in positions] if bucket is None else \
                [bucket_info(bucket, [infos[i] for i in positions], OPS)]
        return out_dtypes, out_infos

    def _init_states(self, dtypes: list, infos: list) -> None:
        """Create the state variables of what keeps a state (:meth:`_stated`: each tensor, or
        its fused bucket), outside any graph being traced."""
        for dtype, info in zip(dtypes, infos):
            if info.name not in self.state and info.numel:
                with tf.init_scope():
                    like = tf.zeros([info.numel], dtype)
                    self.engine.init_state(like, self.state.tensor(info.name), info)

    def _gather_slices(self, grad: tf.IndexedSlices, name: str) -> tf.IndexedSlices:
        """Horovod's sparse path: allgather values and indices, uncompressed."""
        ps = self.options.process_set
        with tf.device(self.options.device_sparse):
            values = hvd.allgather(grad.values, process_set=ps)
            indices = hvd.allgather(grad.indices, process_set=ps)
        if self.core.average:
            values = values / tf.cast(ps.size(), values.dtype)
        return tf.IndexedSlices(values, indices, grad.dense_shape)

    def _exchange(self, grads: list, params: list, infos: list, variables: list, flag: Any = None) -> list:
        """Eager: compress every gradient, communicate, decompress, scale (the engine's job).
        First, every ``check_replicas`` steps, the variables (``(name, variable)`` in name
        order) as this step found them are compared across ranks. With an overflow ``flag``,
        the ranks' flags are summed first: after an overflow on any rank every gradient comes
        back NaN and nothing is compressed (the compressor state is untouched)."""
        self.state.pull()
        if self.built_for != self.state.generation:   # an elastic reset since: the new world's plan
            self.rebuild()
        ps = self.options.process_set
        for info in infos:   # traced infos keep the world of their trace
            info.world, info.rank = ps.size(), ps.rank()
        dtypes = [g.dtype for g in grads]
        bundles = self._bundles(infos, params, dtypes)
        self._apply_loaded(*self._stated(bundles, dtypes, infos))
        self._check_ranks_agree(grads, infos)
        self.replicas.after_step(
            lambda: [(n, v.read_value() if hasattr(v, "read_value") else v) for n, v in variables],
            lambda: counters_checksum(self.compressor.state_dict(), sorted(self.state.named().items())))
        if flag is not None and any_overflow(OPS, self._comm(), tf.reshape(tf.cast(flag, tf.float32), [1])):
            return [tf.fill(tf.shape(g), tf.constant(np.nan, g.dtype)) for g in grads]
        factor = self.core.predivide
        adam = self.compressor if self.adam_settings is not None else None
        settings = None if adam is None else self.adam_settings()
        totals: list = [None] * len(grads)
        for bucket, bundle in bundles:
            items = []
            for i in bundle:
                info = infos[i]
                if params[i] is not None:
                    info.param = tf.reshape(tf.convert_to_tensor(params[i]), [-1])
                x = tf.reshape(grads[i], [-1])
                if adam is not None:  # the gradient or momentum to send (hvdcompress.adam)
                    x = adam.before_exchange(OPS, x, self.state.tensor(info.name), settings, info.param)
                    info.dense = not adam.frozen(settings)
                if factor != 1.0:
                    x = x / factor
                items.append((i, x, info))
            entries = [self.engine.compress(i, x, self.state.tensor(info.name), info) for i, x, info in items] \
                if bucket is None else [compress_bucket(self.engine, bucket, items, self.state.tensor(bucket.name))]
            for entry in self.engine.finish(self.engine.start(entries)):
                for i, total in fused_totals(OPS, entry):
                    totals[i] = total
        if adam is not None:
            for i, total in enumerate(totals):
                if total is not None and params[i] is not None:
                    new = adam.after_exchange(OPS, self.state.tensor(infos[i].name), infos[i].param,
                                              total, settings)
                    params[i].assign(tf.reshape(new, tf.shape(params[i])))
        self.compressor.on_step()
        self.state.push()
        self.engine.end_step()
        return [tf.reshape(tf.cast(t, g.dtype), tf.shape(g)) if t is not None else g
                for g, t in zip(grads, totals)]

    def _check_ranks_agree(self, grads: list, infos: list) -> None:
        """At the first exchange of this compressor state: fail on every rank, naming the
        difference, if ranks disagree on the tensors or settings they exchange with
        (:mod:`hvdcompress.agreement`)."""
        if self.state in _AGREED:
            return
        _AGREED[self.state] = True
        mine = {"params": sorted((info.name, info.shape, g.dtype.name) for info, g in zip(infos, grads)),
                **self.core.agreement(self.engine),
                "overflow_check": self.checks_overflow}   # a collective (the flags' sum)
        check_ranks_agree(mine, self._comm(), OPS, tf.zeros([1]), "hvdcompress.tensorflow")

    def _comm(self) -> HorovodCollectives:
        """Horovod's collectives over the process set (metadata: agreement, overflow flags)."""
        return HorovodCollectives(self.options.process_set, self.options.device_dense)

    @property
    def last_step_bytes(self) -> ByteCount:
        return self.engine.last_step_bytes

    @property
    def total_bytes(self) -> ByteCount:
        return self.engine.total_bytes
