"""TensorFlow gradients as the step driver sees them: names of the sources, the overflow flag,
the global-norm clip, Horovod's uncompressed path for IndexedSlices and local gradients."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import horovod.tensorflow as hvd
import tensorflow as tf


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




def clipped(grads: Sequence[Any], limit: float) -> list:
    """``grads`` (None kept) scaled together to a global L2 norm of at most ``limit``
    (``tf.clip_by_global_norm``)."""
    out = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    for i, g in zip(present, tf.clip_by_global_norm([grads[i] for i in present], limit)[0]):
        out[i] = g
    return out


def gathered_slices(grad: tf.IndexedSlices, process_set: Any, device: str, average: bool) -> tf.IndexedSlices:
    """Horovod's sparse path: values and indices allgathered, uncompressed (divided by the
    number of ranks for op=Average)."""
    with tf.device(device):
        values = hvd.allgather(grad.values, process_set=process_set)
        indices = hvd.allgather(grad.indices, process_set=process_set)
    if average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def scaled_local(grad: Any, process_set: Any) -> Any:
    """A local gradient divided by the process set's size (Horovod's ``scale_local_gradients=True``:
    a local variable moves as if its gradient had been averaged with zeros), read when the step
    runs (an elastic world may change)."""
    if grad is None:
        return None
    n = hvd.size_op(process_set_id=process_set.process_set_id)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


#: graph -> the last exchange built in it (:func:`in_order`)
_LAST: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def in_order(build: Callable[[], list]) -> list:
    """``build()`` (an exchange's ``tf.py_function``) made to run after the previous exchange built
    in the same graph: a TF1 graph runs independent ops concurrently, and two exchanges at once
    would issue Horovod collectives of the same names (Horovod refuses them, and every rank must
    issue them in one order anyway); inside a ``tf.function`` the order is already the program's."""
    graph = tf.compat.v1.get_default_graph()
    last = _LAST.get(graph)
    with tf.control_dependencies([] if last is None else [last]):
        out = build()
    _LAST[graph] = out[0].op
    return out
