"""TensorFlow wrapper: ``DistributedGradientTape`` and ``DistributedOptimizer`` with compression.

Migration from Horovod is the import::

    import horovod.tensorflow as hvd, hvdcompress.tensorflow as hvc
    tape = hvc.DistributedGradientTape(tape, compression=hvdcompress.DGC(0.999, momentum=0.9))

Built on Horovod's collective ops only (allreduce, allgather, broadcast), so it runs on Keras 2
and Keras 3. See :mod:`hvdcompress.tensorflow.exchange` for what one step does, eagerly and in
a ``tf.function``.
"""
from typing import Any

from ..ops.tf_ops import TFOps
from .broadcast import broadcast_variables
from .collectives import node_process_sets
from .keras.optimizer import DistributedOptimizer as _KerasDistributedOptimizer
from .resume import gather_compression_state, load_compression_state
from .state import CompressionState, compression_state
from .tape import DistributedGradientTape, PartialDistributedGradientTape


def DistributedOptimizer(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer`` with compression, for Keras
    optimizers (TF1 ``tf.compat.v1.train.Optimizer`` graphs are not supported); the arguments
    are those of :func:`hvdcompress.tensorflow.keras.DistributedOptimizer`."""
    return _KerasDistributedOptimizer(optimizer, *args, **kwargs)


__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer",
           "TFOps", "CompressionState",
           "compression_state", "broadcast_variables", "node_process_sets",
           "gather_compression_state", "load_compression_state"]
