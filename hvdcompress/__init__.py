"""hvdcompress: gradient compression for Horovod (PyTorch, TensorFlow, Keras).

Compressors live in the framework-agnostic core and are handed to a framework wrapper::

    import hvdcompress.torch as hvc
    from hvdcompress import DGC
    opt = hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=DGC(0.999))
"""
from .adam.frozen import FrozenAdam
from .compressors.cast import BF16, FP16
from .compressors.csc import CSC
from .compressors.dgc import DGC
from .compressors.dithering import Dithering
from .compressors.efsignsgd import EFSignSGD
from .compressors.int8 import Int4, Int8  # Int4: FrozenAdam's long warm-up, not registered
from .compressors.natural import Natural
from .compressors.none import NoCompression
from .compressors.onebit import OneBit
from .compressors.powersgd import PowerSGD
from .compressors.qsgd import QSGD
from .compressors.randomk import RandomK
from .compressors.signum import Signum
from .compressors.terngrad import TernGrad
from .compressors.threshold import Threshold
from .compressors.topk import TopK
from .compressors.twobit import TwoBit
from .contract.compressor import Compressor, Packet, TensorInfo, payload_bytes
from .contract.memory import ErrorFeedback, Momentum
from .contract.schedule import ExponentialWarmup, ListWarmup, SparsityScheduler
from .registry import available, from_params, register
from .step.replicas import ReplicaMismatch

for _cls in (NoCompression, FP16, BF16, TopK, RandomK, DGC, OneBit, EFSignSGD, Signum, Threshold,
             TwoBit, Int8, Dithering, QSGD, TernGrad, Natural, PowerSGD, CSC):
    register(_cls)
from . import auto  # noqa: E402  registers compression="auto" (hvdcompress.auto.Auto, a planner)

__all__ = [
    "Compressor", "Packet", "TensorInfo", "payload_bytes", "ErrorFeedback", "Momentum", "FrozenAdam",
    "NoCompression", "FP16", "BF16", "TopK", "RandomK", "DGC", "CSC", "Threshold", "OneBit",
    "EFSignSGD", "Signum", "TwoBit", "Int8", "Int4", "Dithering", "QSGD", "TernGrad", "Natural",
    "PowerSGD", "ReplicaMismatch", "available", "from_params", "register", "ExponentialWarmup",
    "ListWarmup", "SparsityScheduler",
]
__version__ = "0.1.0"
