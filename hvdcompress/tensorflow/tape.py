"""``DistributedGradientTape``: Horovod's tape with gradient compression.

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvc.DistributedGradientTape(tape, compression=hvdcompress.DGC(0.999, momentum=0.9))
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over ranks
    opt.apply_gradients(zip(grads, model.trainable_variables))

The tape has no optimizer to take momentum from: give a momentum-correcting compressor (DGC,
the Momentum decorator) its own ``momentum`` and use a plain SGD optimizer, or use
:func:`hvdcompress.tensorflow.keras.DistributedOptimizer`, which moves the optimizer's momentum
into the compressor. As in Horovod, the tape has no ``backward_passes_per_step``; accumulate with
the DistributedOptimizer. Compressor state is per compressor object (tapes are created every
step); checkpoint it with :func:`hvdcompress.tensorflow.compression_state`.
"""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from .subclass import subclass_with
from .exchange import GradientExchange, exchange_options


class _DistributedGradientTape:
    """Methods mixed into the wrapped tape's own class by :func:`DistributedGradientTape`."""

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The gradients of ``target``, compressed, exchanged and averaged over ranks."""
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat = self.exchange(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, flat)

    def register_local_source(self, source) -> None:
        """Keep ``source``'s gradient this rank's own: not averaged over ranks, divided by their
        number with ``scale_local_gradients=True`` (Horovod's API and default)."""
        self.exchange.register_local(source)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = None,
                            sparse_as_dense: bool = False, op=hvd.Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups=None, process_set=hvd.global_process_set,
                            clip_grad_norm: float = None, collective: str = "auto",
                            intra_node: Any = None, ranks_per_node: int = None,
                            check_replicas: int = None, auto_allowed: Any = None,
                            link: Any = None, scaler: Any = None,
                            scale_local_gradients: bool = True,
                            fusion: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that :meth:`gradient` returns gradients averaged over ranks.

    Arguments are those of ``horovod.tensorflow.DistributedGradientTape``; ``compression`` takes
    an hvdcompress compressor (default: none) or a dict for :func:`hvdcompress.from_params`.
    The returned tape is an instance of ``gradtape``'s class sharing its recording; its
    ``exchange`` attribute has ``last_step_bytes`` / ``total_bytes`` (dense vs sent bytes).
    ``clip_grad_norm=c``: the way to clip with compression. With a compressor that carries
    state each rank clips its local gradients together to ``c * sqrt(N)`` (op=Average;
    ``c / sqrt(N)`` for op=Sum) before compression; with a stateless one the exchanged
    gradients are clipped to ``c``, as Horovod's clip (see :mod:`hvdcompress.clipping`).
    ``collective``: ``"auto"`` | ``"allgather"`` | ``"alltoall"``, as on the torch optimizer
    (see :mod:`hvdcompress.collectives`). ``intra_node`` / ``ranks_per_node``: two-level
    compression, as on the torch optimizer (:mod:`hvdcompress.two_level`; register the process
    sets with ``hvd.init(process_sets=hvdcompress.tensorflow.node_process_sets())``). The tape is
    created every step, its exchange with it: build it with the same arguments on every rank.
    ``check_replicas=N``: every N steps, compare a checksum of every variable (and the
    compressor's counters) across the process set before the exchange, and raise
    :class:`hvdcompress.replicas.ReplicaMismatch` on every rank at the first difference (default:
    the environment variable ``HVDCOMPRESS_CHECK_REPLICAS``, else off; the step count lives
    with the compressor, across tapes; see :mod:`hvdcompress.replicas`).
    ``compression="auto"`` with ``auto_allowed`` / ``link``: per tensor, the compressor and
    collective the cost model picks, as on the torch optimizer (:mod:`hvdcompress.auto`); the
    plan lives with the compressor object: pass the same ``hvdcompress.auto.Auto`` (or
    ``tape.exchange.compressor`` of the first tape) to every step's tape, or it plans anew.

    ``scaler=``: the Keras ``tf.keras.mixed_precision.LossScaleOptimizer`` of mixed-precision
    training (Keras 2), whose current loss scale s the loss was multiplied by. Each gradient is
    divided by s (the scaler's ``get_unscaled_gradients``) before the clip and the compressor
    see it, so residuals and momenta hold unscaled gradients and the result does not depend on
    s; ``gradient`` returns unscaled gradients (do not call ``get_unscaled_gradients`` again).
    Before compressing, the ranks sum their overflow flags (one allreduce of one number): if any
    rank's gradients hold an inf or NaN, nothing is compressed, the compressor state stays as it
    was on every rank, and every returned gradient is NaN, so ``scaler.apply_gradients`` skips
    the step and lowers the scale on every rank alike::

        with tf.GradientTape() as tape:
            scaled_loss = opt.get_scaled_loss(loss_fn(model(x), y))   # opt: LossScaleOptimizer
        tape = hvc.DistributedGradientTape(tape, compression=dgc, scaler=opt)
        grads = tape.gradient(scaled_loss, model.trainable_variables)  # unscaled, averaged
        opt.apply_gradients(zip(grads, model.trainable_variables))

    See docs/mixed_precision.md and :mod:`hvdcompress.loss_scale`.

    ``fusion=B``: fused compression, as on the torch optimizer (:mod:`hvdcompress.fusion`):
    consecutive gradients in name order, of one dtype, up to ``B`` bytes (``True``: 64 MiB), are
    compressed as one buffer and sent in one collective per round.

    ``scale_local_gradients``: divide the gradients of the sources registered with
    :meth:`register_local_source` by the number of ranks (Horovod's default, True), or leave
    them as they are (False).
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"gradtape={gradtape!r}: allowed: a tf.GradientTape")
    options = exchange_options(compression, device_dense=device_dense, device_sparse=device_sparse,
                               sparse_as_dense=sparse_as_dense, op=op,
                               gradient_predivide_factor=gradient_predivide_factor,
                               num_groups=num_groups, groups=groups, process_set=process_set,
                               clip_grad_norm=clip_grad_norm, collective=collective,
                               intra_node=intra_node, ranks_per_node=ranks_per_node,
                               check_replicas=check_replicas, auto_allowed=auto_allowed, link=link,
                               scaler=scaler, scale_local_gradients=scale_local_gradients, fusion=fusion)
    cls = subclass_with(gradtape.__class__, _DistributedGradientTape)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape.exchange = GradientExchange(options)
    return tape
