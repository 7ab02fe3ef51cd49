"""Keras wrapper: ``hvdcompress.tensorflow.keras.DistributedOptimizer`` and callbacks.

    import hvdcompress.tensorflow.keras as hvck
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                    compression=hvdcompress.DGC(0.999))
    model.fit(x, y, callbacks=[hvck.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvck.callbacks.SparsityWarmupCallback(opt, ExponentialWarmup(4))])

``PartialDistributedOptimizer(opt, local_layers=[...])``: Horovod's, for model parallelism.

Works with Keras 2 (TF <= 2.15) and Keras 3 (TF >= 2.16).
"""
from ..broadcast import broadcast_variables
from . import callbacks
from .optimizer import DistributedOptimizer
from .partial import PartialDistributedOptimizer

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "broadcast_variables", "callbacks"]
