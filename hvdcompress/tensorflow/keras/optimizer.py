"""``DistributedOptimizer`` for Keras optimizers (Keras 2 and Keras 3), with compression.

    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                    compression=hvdcompress.DGC(0.999))
    model.compile(optimizer=opt, loss=..., jit_compile=False)   # Keras 3: no XLA, see below

The gradients are compressed, exchanged and averaged over ranks (see
:mod:`hvdcompress.tensorflow.exchange`) exactly once per step, then applied by the wrapped
optimizer. Where: on Keras 2, ``compute_gradients`` (``_compute_gradients`` on the legacy
optimizers), which ``minimize`` and so ``model.fit`` call, returns the gradients already
exchanged, as Horovod's optimizer does, and ``apply_gradients`` given those very tensors
(eagerly, or in the same traced function) applies them without a second exchange;
``apply_gradients`` with gradients from elsewhere (a ``GradientTape`` loop; Keras 3, whose
optimizers have no ``compute_gradients`` and whose ``fit`` calls ``apply_gradients``) exchanges
them itself. Either way the exchange sees the same gradients, so the results are the same bit
for bit (:class:`KerasStep`). Transforming the gradients between ``compute_gradients`` and
``apply_gradients`` (clipping, say) acts on the exchanged ones. Horovod's
``_compute_gradients(loss, var_list, grad_loss=None, tape=None)`` is on every Keras's (by the
tape where the optimizer has none). The step runs one
``tf.py_function``, which XLA cannot compile: Keras 3 compiles ``fit`` with XLA by default
(``jit_compile="auto"``), so pass ``jit_compile=False`` to ``model.compile`` there.

``opt.register_local_var(v)``: ``v``'s gradient stays this rank's own (not exchanged, clipped or
compared by the replica guard); with ``scale_local_gradients=True`` (Horovod's default) it is
divided by the number of ranks, as Horovod's is.

Momentum taken over: with a compressor that applies momentum itself (``takes_over_momentum``:
DGC, the Momentum decorator) and a Keras ``SGD``, the wrapper reads the SGD's ``momentum`` and
``nesterov`` once, hands them to the compressor for every variable, and builds the wrapped SGD
with ``momentum=0, nesterov=False``, so it takes plain steps on the momentum-corrected
gradient. Keras's ``weight_decay`` is decoupled (applied to the weights, not through
momentum), so it stays in the optimizer. A compressor with an explicit momentum next to an SGD
with momentum is an error (momentum would apply twice). Other optimizers are left alone.

Adam taken over: with :class:`hvdcompress.FrozenAdam` around the compressor and a Keras ``Adam``
or ``AdamW``, the exchange updates the variables itself (:mod:`hvdcompress.adam.frozen`: a
full-precision warm-up, then each rank's gradient compressed, v frozen), reading the learning
rate (or schedule), betas, epsilon and the decoupled weight decay of the wrapped optimizer; the
wrapped optimizer's own step is not run (its ``iterations`` still count the steps), and m and v
live in the compressor state, checkpointed with the optimizer.

``backward_passes_per_step=N``: gradients are summed locally in variables (averaged if
``average_aggregated_gradients``) and exchanged and applied on every N-th call only, as in
Horovod; ``iterations`` counts every call, as Horovod's does, and the sums restart from zeros
after each step (an inf or NaN of one cycle does not reach the next). IndexedSlices are
densified for that. On the other calls ``compute_gradients`` returns the local sums so far
(not applied), as Horovod's. The helper is ``opt._agg_helper`` too (Horovod's name), whose
``counter`` counts the calls of the current cycle (0 after a step).

Around a Keras ``LossScaleOptimizer`` (``DistributedOptimizer(LossScaleOptimizer(SGD(...)))``), the
gradients reach ``apply_gradients`` unscaled; the ranks sum their overflow flags before
compressing, and after an overflow on any rank nothing is compressed (the compressor state stays
as it was) and the exchanged gradients are NaN on every rank, so every rank's
``LossScaleOptimizer`` skips the step and lowers its scale (docs/mixed_precision.md).

Compressor state (residuals, momenta, velocities, DGC's counters) is tracked by the optimizer,
so ``tf.train.Checkpoint(optimizer=opt)`` and TF-format ``model.save_weights`` capture it.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import horovod.tensorflow as hvd
import tensorflow as tf

from ...step.arguments import documented
from ...step.options import check_unwrapped
from ..exchange import GradientExchange, exchange_options, is_loss_scale_optimizer
from ..subclass import subclass_with
from .accumulate import GradientAccumulator
from .compute import tape_gradients
from .settings import adam_settings, keras_classes, take_over_momentum, warn_keras_clipping


class KerasStep:
    """One Keras step's exchange, run exactly once whichever way Keras goes:

    * ``compute_gradients`` (Keras 2; ``_compute_gradients`` on its legacy optimizers), which
      Keras 2's ``minimize`` and so ``fit`` call, computes the gradients and hands them to
      :meth:`computed`: :meth:`reduce` exchanges them and the exchanged tensors are kept; the
      ``apply_gradients`` that follows receives those very tensors (:meth:`take_mark`) and
      applies them without exchanging again, as Horovod's optimizer does;
    * ``apply_gradients`` with other gradients (a tape, Keras 3's ``fit``) runs :meth:`reduce`
      itself.

    Either way the exchange sees the same gradients and variables, so the bits are the same.
    """

    def __init__(self, exchange: GradientExchange, accumulator: Optional[GradientAccumulator]):
        self.exchange = exchange
        self.accumulator = accumulator
        self._marked: list = []   # the tensors computed() exchanged, until they are applied

    def computed(self, grads_and_vars) -> list:
        """``compute_gradients``'s pairs with their gradients exchanged (:meth:`reduce`), marked."""
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        grads = self.reduce([g for g, _ in pairs], variables)
        self._marked = grads
        return list(zip(grads, variables))

    def take_mark(self, grads: list) -> bool:
        """Whether ``grads``, about to be applied here, are the very tensors :meth:`computed`
        exchanged here (then forget them: one exchange, one apply). Gradients from elsewhere
        (a tape, after a ``compute_gradients`` whose result was dropped) are exchanged."""
        marked, self._marked = self._marked, []
        return bool(marked) and len(marked) == len(grads) and all(a is b for a, b in zip(marked, grads))

    def reduce(self, grads: list, variables: list) -> list:
        """One backward pass's gradients, ready to apply: exchanged. With N passes per step: the
        cycle's sums (or means) exchanged on the N-th pass, the local sums so far on the others
        (which :meth:`apply` does not apply). None stays None."""
        acc = self.accumulator
        if acc is None:
            return self.exchange(grads, variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        ready = acc.add([tf.convert_to_tensor(grads[i]) for i in present])

        def exchanged() -> list:
            cycle = [None] * len(grads)
            for i, total in zip(present, acc.take()):
                cycle[i] = total
            out = self.exchange(cycle, variables)
            return [out[i] for i in present]

        if tf.executing_eagerly():
            chosen = exchanged() if bool(ready) else acc.running()
        else:
            chosen = tf.cond(ready, exchanged, acc.running)
        out = [None] * len(grads)
        for i, g in zip(present, chosen):
            out[i] = g
        return out

    def apply(self, optimizer: Any, grads: list, variables: list, update: Callable) -> Any:
        """``update(grads)`` (the optimizer's step); with N passes per step, only when the
        last pass completed a step, else ``iterations`` alone moves (Horovod's count)."""
        acc = self.accumulator
        if acc is None:
            return update(grads)
        if not getattr(optimizer, "built", True):
            optimizer.build(variables)

        def step():
            update(grads)
            return tf.constant(True)

        def count():
            optimizer.iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            return step() if bool(acc.ready()) else count()
        return tf.cond(acc.ready(), step, count)


class _DistributedOptimizer:
    """Methods mixed into the wrapped optimizer's class by :func:`DistributedOptimizer`
    (``compute_gradients`` / ``_compute_gradients`` only where the class has it)."""

    def _hvdc_update(self, grads: list, variables: list, args: tuple, kwargs: dict):
        """Apply exchanged ``grads``: with the wrapped optimizer's own step, or, with the Adam
        take-over, whose exchange updated the variables, by moving ``iterations`` only."""
        exchange = self._hvdc_exchange
        if exchange.adam_settings is None or not exchange.options.process_set.included():
            return super(self.__class__, self).apply_gradients(zip(grads, variables), *args, **kwargs)
        with tf.control_dependencies([g for g in grads if g is not None]):
            return self.iterations.assign_add(1)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Exchange the gradients over ranks, unless this optimizer's ``compute_gradients``
        just did, then apply them (every N-th call with N passes)."""
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        step = self._hvdc_step
        if not step.take_mark(grads):
            grads = step.reduce(grads, variables)
        return step.apply(self, grads, variables,
                          lambda exchanged: self._hvdc_update(exchanged, variables, args, kwargs))

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, exchanged over ranks (Keras 2's optimizers)."""
        return self._hvdc_step.computed(super(self.__class__, self).compute_gradients(*args, **kwargs))

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """``(gradient, variable)`` pairs of ``loss``, exchanged over ranks, as Horovod's: by
        the wrapped optimizer's own ``_compute_gradients`` (Keras 2's legacy optimizers, whose
        ``minimize`` calls it), else by ``tape`` (:func:`.compute.tape_gradients`: Keras 2's
        new optimizers, Keras 3's). With N passes per step, as :meth:`KerasStep.reduce`."""
        base = super(self.__class__, self)
        pairs = (base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
                 if hasattr(base, "_compute_gradients") else tape_gradients(loss, var_list, grad_loss, tape))
        return self._hvdc_step.computed(pairs)

    @property
    def _agg_helper(self):
        """Horovod's name for the aggregation helper (None with one pass per step)."""
        return self._hvdc_accumulator

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient this rank's own: not averaged over ranks, divided by their
        number with ``scale_local_gradients=True`` (Horovod's API and default)."""
        self._hvdc_exchange.register_local(var)

    total_bytes = property(lambda self: self._hvdc_exchange.total_bytes,
                           doc="This rank's dense versus sent bytes since construction (ByteCount).")
    last_step_bytes = property(lambda self: self._hvdc_exchange.last_step_bytes,
                               doc="This rank's dense versus sent bytes of the last step (ByteCount).")


def _mixin_for(base: type) -> type:
    """:class:`_DistributedOptimizer` without ``compute_gradients`` where ``base`` lacks it
    (Keras 3); ``_compute_gradients`` is on every one (by the tape where ``base`` lacks it)."""
    lacking = set() if hasattr(base, "compute_gradients") else {"compute_gradients"}
    return type("_DistributedOptimizer", (),
                {k: v for k, v in vars(_DistributedOptimizer).items()
                 if k not in lacking | {"__dict__", "__weakref__"}})


@documented("compression", "clip_grad_norm", "collective", "intra_node", "check_replicas", "auto",
            "fusion", "bytes")
def DistributedOptimizer(optimizer: Any, name: str = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = None,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op=hvd.Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups=None, process_set=hvd.global_process_set,
                         scale_local_gradients: bool = True, clip_grad_norm: float = None, collective: str = "auto",
                         intra_node: Any = None, ranks_per_node: int = None,
                         check_replicas: int = None, auto_allowed: Any = None,
                         link: Any = None, fusion: Any = None) -> Any:
    """Wrap a Keras ``optimizer`` so that gradients are compressed, exchanged and averaged.

    Arguments are those of ``horovod.tensorflow.keras.DistributedOptimizer``; ``compression``
    takes an hvdcompress compressor (default: none) or a dict for
    :func:`hvdcompress.from_params`. Returns a new optimizer of the same class and config
    (momentum moved into the compressor where it takes it over, see the module doc).

    ``scale_local_gradients``: divide the gradients of the variables registered with
    ``register_local_var`` by the number of ranks (default True, as Horovod).
    Keras's own ``clipnorm`` / ``global_clipnorm`` / ``clipvalue`` act on the exchanged update,
    which, with a compressor that applies the momentum or keeps a residual, is not the gradient:
    that warns; use ``clip_grad_norm``. Two-level compression needs the process sets:
    ``hvd.init(process_sets=hvdcompress.tensorflow.node_process_sets())``. A Keras
    ``LossScaleOptimizer`` wrapped here is the loss scaler (the overflow check of ``scaler``).
    """
    if not isinstance(optimizer, keras_classes("Optimizer")):
        raise TypeError(f"optimizer={optimizer!r}: allowed: a Keras optimizer "
                        "(tf.keras.optimizers.*)")
    check_unwrapped("hvdcompress.tensorflow.keras.DistributedOptimizer", "optimizer", optimizer)
    options = exchange_options(compression, device_dense=device_dense, device_sparse=device_sparse,
                               sparse_as_dense=sparse_as_dense, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               gradient_predivide_factor=gradient_predivide_factor,
                               num_groups=num_groups, groups=groups, process_set=process_set,
                               clip_grad_norm=clip_grad_norm, collective=collective,
                               intra_node=intra_node, ranks_per_node=ranks_per_node,
                               check_replicas=check_replicas, auto_allowed=auto_allowed, link=link,
                               scale_local_gradients=scale_local_gradients, fusion=fusion)
    compressor = options.core.compressor
    config = optimizer.get_config()
    warn_keras_clipping(compressor, options.core.intra_node, config)
    if name is not None:
        config["name"] = name
    momentum, nesterov = take_over_momentum(compressor, optimizer, config)
    cls = subclass_with(optimizer.__class__, _mixin_for(optimizer.__class__))
    wrapped = cls.from_config(config)
    # around a LossScaleOptimizer: an overflow on any rank is found before compression, so the
    # compressor state is untouched and every rank's LossScaleOptimizer skips (docs/mixed_precision.md)
    wrapped._hvdc_exchange = GradientExchange(options, momentum, nesterov,
                                              adam_settings=adam_settings(wrapped, compressor, config),
                                              overflow_check=is_loss_scale_optimizer(optimizer))
    wrapped._hvdc_compression_state = wrapped._hvdc_exchange.state
    wrapped._hvdc_accumulator = (GradientAccumulator(backward_passes_per_step,
                                                     average_aggregated_gradients)
                                 if backward_passes_per_step > 1 else None)
    wrapped._hvdc_step = KerasStep(wrapped._hvdc_exchange, wrapped._hvdc_accumulator)
    return wrapped
