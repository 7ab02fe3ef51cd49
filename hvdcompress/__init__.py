"""hvdcompress: gradient compression for Horovod (PyTorch, TensorFlow, Keras).

Compressors live in the framework-agnostic core and are handed to a framework wrapper::

    import hvdcompress.torch as hvc
    from hvdcompress import DGC
    opt = hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=DGC(0.999))
"""
from .compressor import Compressor, Packet, TensorInfo, payload_bytes
from .compressors.cast import BF16, FP16
from .compressors.dgc import DGC
from .compressors.none import NoCompression
from .compressors.randomk import RandomK
from .compressors.topk import TopK
from .memory import ErrorFeedback, Momentum
from .registry import available, from_params, register
from .schedule import ExponentialWarmup, ListWarmup, SparsityScheduler

for _cls in (NoCompression, FP16, BF16, TopK, RandomK, DGC):
    register(_cls)

__all__ = [
    "Compressor", "Packet", "TensorInfo", "payload_bytes", "NoCompression", "FP16", "BF16",
    "TopK", "RandomK", "DGC", "ErrorFeedback", "Momentum", "available", "from_params",
    "register", "ExponentialWarmup", "ListWarmup", "SparsityScheduler",
]
__version__ = "0.1.0"
