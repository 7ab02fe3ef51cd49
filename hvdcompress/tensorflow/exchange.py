"""The TensorFlow front end of the step driver (:mod:`hvdcompress.step.driver`): the exchange behind
:func:`~hvdcompress.tensorflow.DistributedGradientTape` and the Keras ``DistributedOptimizer``.

The algorithm of one step is the core's, the same as for torch: the front-end contract's sequence
(:mod:`hvdcompress.step.frontend`, filled by :class:`~hvdcompress.tensorflow.steps.TapeSteps`) around
the step driver and its engine; this module keeps what is TensorFlow's: variables as state
(:mod:`.state`), IndexedSlices, ``None`` gradients, graph mode, and Horovod's TF collectives.
Only Horovod's collective ops are used, so this works with Keras 2 and Keras 3 alike.

Graph mode: the core takes Python decisions on tensor values (DGC's threshold loop, random-k's
host-side draw, FrozenAdam's v-steps) and the payload layout may
change from step to step. Inside a ``tf.function`` the whole exchange therefore runs as one
``tf.py_function``: the same eager code as in eager mode, hence the same results as the torch
path, and nothing about sparsity, step or epoch is baked into the graph. The price: one host
round trip per step and no XLA (``jit_compile=True``) for the training step.

IndexedSlices are densified with ``sparse_as_dense=True`` or a take-over, else allgathered
uncompressed, as Horovod does. ``None`` gradients stay ``None``.

Loss scaling (:mod:`hvdcompress.step.loss_scale`): ``scaler=`` (a Keras 2 ``LossScaleOptimizer``)
unscales every gradient first; with it, or a Keras optimizer around one, the ranks' overflow
flags are summed before the exchange, and after an overflow on any rank nothing is compressed
(the state stays) and every gradient comes back NaN, so the scaler skips the step everywhere.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..adam.settings import AdamSettings
from ..contract.compressor import TensorInfo
from ..engines.fusion import bucket_info
from ..engines.selection import build_exchange
from ..ops.tf_ops import TFOps
from ..step.clipping import local_clip_limit
from ..step.driver import StepDriver
from ..step.loss_scale import any_overflow
from .collectives import HorovodCollectives
from .gradients import clipped, gathered_slices, in_order, overflow_flag, scaled_local, source_names
from .options import ExchangeOptions, exchange_options, is_loss_scale_optimizer  # noqa: F401 (the API)
from .resume import apply_loaded
from .state import compression_state
from .steps import TapeSteps

OPS = TFOps()


def _driver(options: ExchangeOptions, state: Any, adam: Any) -> StepDriver:
    """The driver of ``state`` for ``options``: tapes, and their exchanges, are created every step;
    the driver (agreement, replica guard, bytes, engine) lives with the state, as its attribute
    (outside tf.Module's tracking), so both go together."""
    kept = vars(state).get("_hvdc_driver")
    if kept is not None and kept[0] == options:
        return kept[1]
    core, ps = options.core, options.process_set

    def comm(process_set: Any = ps) -> HorovodCollectives:
        return HorovodCollectives(process_set, options.device_dense)

    driver = StepDriver(core, OPS, lambda: build_exchange(
        hvd, comm, ps, core.compressor, OPS, intra_node=core.intra_node, ranks_per_node=core.ranks_per_node,
        average=core.average, predivide=core.predivide, collective=core.collective),
        comm, "hvdcompress.tensorflow", adam=adam, states=state, ranks=getattr(ps, "ranks", None))
    vars(state)["_hvdc_driver"] = (options, driver)
    return driver


class GradientExchange:
    """Compresses, communicates and averages gradients with one compressor and fixed options.

    ``momentum`` / ``nesterov``: the wrapped optimizer's settings that the compressor takes over
    (handed to it in :class:`TensorInfo`). ``adam_settings``: the Keras Adam's settings, read
    each step, for FrozenAdam. ``overflow_check``: ask every rank whether any gradient
    overflowed before compressing (module doc). ``total_bytes`` / ``last_step_bytes``: the
    driver's (:class:`~hvdcompress.engines.accounting.ByteCount`).
    """

    def __init__(self, options: ExchangeOptions, momentum: float = 0.0, nesterov: bool = False,
                 adam_settings: Optional[Callable[[], AdamSettings]] = None,
                 overflow_check: bool = False):
        compressor = options.core.compressor
        if compressor.takes_over_adam and adam_settings is None:
            raise ValueError(f"compression={compressor!r}: the Adam take-over (FrozenAdam) replaces "
                             "the optimizer's step, so it runs on hvdcompress.torch."
                             "DistributedOptimizer and hvdcompress.tensorflow.keras."
                             "DistributedOptimizer (around a Keras Adam or AdamW), not on the tape, "
                             "whose gradients your own optimizer applies")
        self.adam_settings = adam_settings   # the Keras optimizer's Adam settings, read each step
        self.compressor = compressor
        self.options = options
        self.core = core = options.core
        self.momentum, self.nesterov = momentum, nesterov
        self.state = compression_state(compressor)
        self.state.process_set, self.state.average = options.process_set, core.average
        self.driver = _driver(options, self.state, compressor if adam_settings is not None else None)
        self.built_for = self.state.generation
        self.local: dict = {}   # id -> variable whose gradient stays this rank's own
        self.scaler = core.scaler   # the Keras LossScaleOptimizer of scaler= (hvdcompress.step.loss_scale)
        self.checks_overflow = overflow_check or self.scaler is not None

    engine = property(lambda self: self.driver.engine)
    last_step_bytes = property(lambda self: self.driver.last_step_bytes)
    total_bytes = property(lambda self: self.driver.total_bytes)

    def rebuild(self) -> None:
        """Rebuild for Horovod's current world after ``hvd.shutdown(); hvd.init()`` at another
        size (:meth:`hvdcompress.step.driver.StepDriver.rebuild`; :mod:`hvdcompress.tensorflow.elastic`);
        the state is laid out by :func:`hvdcompress.tensorflow.load_compression_state`. Runs by
        itself at the first exchange after the state's ``generation`` changed."""
        global_flat = self.options.process_set is hvd.global_process_set and self.core.intra_node is None
        self.driver.rebuild(None if global_flat else "this exchange runs over a process set (or two-level "
                            "compression's node sets)")
        self.built_for = self.state.generation

    def register_local(self, variable: Any) -> None:
        """Keep ``variable``'s gradient local: not exchanged, clipped or checked across ranks
        (Horovod's ``register_local_var`` / ``register_local_source``: e.g. a per-rank head);
        divided by the number of ranks with ``scale_local_gradients=True`` (the default)."""
        if self.adam_settings is not None:
            raise ValueError("register_local_var with the Adam take-over (FrozenAdam): the exchange "
                             "updates the variables itself, so a local variable would not be "
                             "updated; use a compressor without FrozenAdam")
        self.local[id(variable)] = variable

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
            out[i] = scaled_local(grads[i], self.options.process_set) if self.options.scale_local else grads[i]
        return out

    def _shared(self, grads: Sequence[Any], sources: Sequence[Any], flag: Any = None) -> list:
        """The exchange of ``grads`` with ``clip_grad_norm`` before or after it (None kept; the
        driver's order: before with a compressor that carries state, FrozenAdam included)."""
        c = self.core.clip_grad_norm
        if c is None or self.driver.adam is not None:   # the take-over's clip changes per step: in _exchange
            return self._reduce(grads, sources, flag)
        if self.driver.clips_before():
            return self._reduce(clipped(grads, self._local_limit()), sources, flag)
        return clipped(self._reduce(grads, sources, flag), c)

    def _local_limit(self) -> float:
        return local_clip_limit(self.core.clip_grad_norm, self.options.process_set.size(), average=self.core.average)

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
                    out[i] = gathered_slices(g, self.options.process_set, self.options.device_sparse, self.core.average)
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
            reduced = in_order(lambda: tf.py_function(lambda *g: self._exchange(list(g), params, infos, variables),
                                                      inputs, Tout=[g.dtype for g in inputs]))
        else:
            reduced = in_order(lambda: tf.py_function(lambda f, *g: self._exchange(list(g), params, infos, variables, f),
                                                      [flag] + inputs, Tout=[g.dtype for g in inputs]))
            for r, g in zip(reduced, inputs):
                r.set_shape(g.shape)
        for i, r in zip(dense, reduced):
            out[i] = r
        return out

    def _bundles(self, infos: list, params: list, dtypes: list) -> list:
        """``(bucket, positions)`` of the exchanged gradients, one per grouped collective, in
        name order (:meth:`hvdcompress.step.options.Options.group_ids`); ``bucket``: the
        :class:`hvdcompress.engines.fusion.Bucket` compressed as one with ``fusion=``, else None."""
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

    def _exchange(self, grads: list, params: list, infos: list, variables: list, flag: Any = None) -> list:
        """Eager: one step of the driver over every dense gradient (the bundles in name order,
        each started and finished in turn). First the rank agreement (once) and, every
        ``check_replicas`` steps, the variables compared across ranks; with an overflow ``flag``
        the ranks' flags are summed first, and after an overflow on any rank every gradient
        comes back NaN with nothing compressed. With FrozenAdam the clip of this step (the
        driver's: each rank's, scaled by ``clip_scale()``, or the mean's, kept) is applied here,
        and the variables are updated."""
        self.state.pull()
        if self.built_for != self.state.generation:   # an elastic reset since: the new world's plan
            self.rebuild()
        driver, ps = self.driver, self.options.process_set
        for info in infos:   # traced infos keep the world of their trace
            info.world, info.rank = ps.size(), ps.rank()
        dtypes = [g.dtype for g in grads]
        bundles = self._bundles(infos, params, dtypes)
        apply_loaded(self, *self._stated(bundles, dtypes, infos))
        driver.agree([(info.name, info.shape, g.dtype.name) for info, g in zip(infos, grads)], tf.zeros([1]),
                     overflow_check=self.checks_overflow)   # a collective (the flags' sum)
        driver.check_replicas(lambda: [(n, v.read_value() if hasattr(v, "read_value") else v) for n, v in variables])
        if flag is not None and any_overflow(OPS, driver.comm, tf.reshape(tf.cast(flag, tf.float32), [1])):
            return [tf.fill(tf.shape(g), tf.constant(np.nan, g.dtype)) for g in grads]
        settings = None if driver.adam is None else self.adam_settings()
        steps = TapeSteps(self, grads, params, infos, bundles, settings)
        steps.run()
        totals = steps.totals
        for i, total in enumerate(totals if driver.adam is not None else ()):
            if total is not None and params[i] is not None:
                new = driver.adam.after_exchange(OPS, self.state.tensor(infos[i].name), infos[i].param, total, settings)
                params[i].assign(tf.reshape(new, tf.shape(params[i])))
        steps.updated()
        self.state.push()
        return [tf.reshape(tf.cast(t, g.dtype), tf.shape(g)) if t is not None else g for g, t in zip(grads, totals)]
