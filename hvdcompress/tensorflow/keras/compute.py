"""The gradients of a loss with a ``tf.GradientTape``, as Keras 2's legacy optimizers compute them
in ``_compute_gradients``: for the Keras optimizers that have no such method (Keras 2's new
optimizers, Keras 3's), so that :func:`~hvdcompress.tensorflow.keras.DistributedOptimizer`'s
``_compute_gradients(loss, var_list, grad_loss=None, tape=None)`` works on every Keras, as
Horovod's does."""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf


def _watchable(x: Any) -> Optional[Any]:
    """What a tape can watch for ``x``: a tf.Variable or tensor itself, a Keras 3 variable's
    tf.Variable (``.value``); None otherwise."""
    if isinstance(x, (tf.Variable, tf.Tensor)):
        return x
    inner = getattr(x, "value", None)
    return inner if isinstance(inner, tf.Variable) else None


def tape_gradients(loss: Any, var_list: Any, grad_loss: Any = None,
                   tape: Optional[tf.GradientTape] = None) -> list:
    """``(gradient, variable)`` pairs of ``loss`` for ``var_list`` (flattened; a nested list is
    allowed, as Keras 2's legacy ``_compute_gradients`` allows it). ``loss``: a callable (run
    under ``tape``, a new one if None, which watches ``var_list``) or a tensor recorded on
    ``tape`` (then required). ``var_list`` may be a callable returning the variables.
    ``grad_loss``: the output gradient of ``loss`` (``tape.gradient``'s ``output_gradients``)."""
    if not callable(loss) and tape is None:
        raise ValueError("loss is a tensor and tape=None: allowed: a callable loss, or a tensor "
                         "loss with the tape= that recorded it")
    tape = tf.GradientTape() if tape is None else tape
    if callable(loss):
        with tape:
            if not callable(var_list):
                watched = [w for w in map(_watchable, tf.nest.flatten(var_list)) if w is not None]
                tape.watch(watched)
            loss = loss()
    if callable(var_list):
        var_list = var_list()
    variables = tf.nest.flatten(var_list)
    grads = tape.gradient(loss, variables, output_gradients=grad_loss)
    return list(zip(grads, variables))
