"""Horovod elastic training on TensorFlow / Keras with compression: :class:`TensorFlowKerasState`.

::

    import horovod.tensorflow as hvd
    import hvdcompress.tensorflow.keras as hvck
    from hvdcompress.tensorflow.elastic import TensorFlowKerasState

    hvd.init()
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9), compression=...)
    opt.build(model.trainable_variables)     # slots exist on every rank, joining ones included
    state = TensorFlowKerasState(model, opt, batch=0)

    @hvd.elastic.run
    def train(state):
        ...; opt.apply_gradients(...); state.batch += 1; state.commit()

In place of ``hvd.elastic.TensorFlowKerasState`` (whose ``optimizer.variables()`` fails on Keras
optimizers where ``variables`` is a property) or ``horovod.tensorflow.keras.elastic.KerasState``.
With :func:`hvdcompress.tensorflow.DistributedGradientTape`, pass the compressor given to the
tapes: ``TensorFlowKerasState(model, opt, compression=dgc, batch=0)``.

What happens, besides Horovod's own handling of the model's and the optimizer's variables
(saved on commit, restored after a failure, broadcast from rank 0 on sync):

* ``commit()`` (save): every rank's compressor state is gathered
  (:func:`hvdcompress.tensorflow.gather_compression_state`, one allgather), so that a rank that
  leaves does not take its unsent error-feedback mass with it.
* reset (ranks added or removed): the compressor state's ``generation`` is bumped, so every
  exchange built on it rebuilds for the new world at its next step (each tensor's collective
  planned again, the replica guard, the rank agreement, which a joining rank makes at its first
  step too), and the last commit is loaded: laid out there for the new world by
  :mod:`hvdcompress.state.reshard` (Σ_r e_r / P kept with op=Average). Local.
* ``sync()`` (after every reset, removals included: :mod:`hvdcompress.step.elastic`): rank 0's last
  commit is broadcast and loaded by every rank, so a joining rank gets the same share as the
  others.
* ``restore()`` (a failure): the last commit.

Commit before the first reset (Horovod's pattern commits every few batches): without a commit
there is no gathered state to lay out for the new world.
"""
from __future__ import annotations

from typing import Any, Optional

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState

from ..contract.compressor import Compressor
from ..step.elastic import SyncEveryReset
from .broadcast import broadcast_variables, optimizer_variables
from .resume import _resolve, gather_compression_state, load_compression_state


class CompressionHandler:
    """Gathered compressor state across elastic events for one target (an hvdcompress Keras
    optimizer, a tape's compressor)."""

    def __init__(self, target: Any):
        self.target = target
        self.state, _ = _resolve(target)
        self.saved: Optional[dict] = None

    def save(self) -> None:
        self.saved = gather_compression_state(self.target)

    def restore(self) -> None:
        if self.saved is not None:
            load_compression_state(self.target, self.saved)

    def reset(self) -> None:
        """Horovod was initialised again: rebuild the exchanges, lay out the last commit."""
        self.state.generation += 1
        self.restore()

    def sync(self, index: int) -> None:
        self.saved = hvd.broadcast_object(self.saved, root_rank=0, name=f"hvdc.elastic.state.{index}")
        self.restore()


def _targets(optimizer: Any, compression: Any) -> list:
    found = [optimizer] if getattr(optimizer, "_hvdc_exchange", None) is not None else []
    extra = [] if compression is None else list(compression) if isinstance(compression, (list, tuple)) else [compression]
    for c in extra:
        if not isinstance(c, Compressor):
            raise ValueError(f"compression={compression!r}: allowed: None, an hvdcompress Compressor given "
                             "to DistributedGradientTape, or a list of them")
    return found + extra


class TensorFlowKerasState(SyncEveryReset, ObjectState):
    """Elastic state of a Keras model, its optimizer and their compressor state (module doc).

    ``model``: a built Keras model; ``optimizer``: its optimizer (default ``model.optimizer``),
    built (``optimizer.build(variables)``) so that its slots exist on every rank;
    ``compression``: the compressor(s) of ``DistributedGradientTape``; ``kwargs``: Python values
    synced from rank 0 (Horovod's ``ObjectState``)."""

    def __init__(self, model: Any, optimizer: Any = None, compression: Any = None, **kwargs: Any):
        if not getattr(model, "built", True):
            raise ValueError(f"model={model!r} is not built: build it first (model.build(input_shape))")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._handlers = [CompressionHandler(t) for t in _targets(self.optimizer, compression)]
        self._save_model()
        super().__init__(bcast_object=lambda obj: hvd.broadcast_object(obj, root_rank=0),
                         get_rank=hvd.rank, **kwargs)

    def _variables(self) -> list:
        return list(self.model.variables) + \
            (optimizer_variables(self.optimizer) if self.optimizer is not None else [])

    def _save_model(self) -> None:
        self._saved_variables = [tf.identity(v) for v in self._variables()]

    def _load_model(self) -> None:
        for var, value in zip(self._variables(), self._saved_variables):
            var.assign(value)

    def save(self) -> None:
        self._save_model()
        for handler in self._handlers:
            handler.save()
        super().save()

    def restore(self) -> None:
        self._load_model()
        for handler in self._handlers:
            handler.restore()
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        for i, handler in enumerate(self._handlers):
            handler.sync(i)
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers:
            handler.reset()
        super().reset()
