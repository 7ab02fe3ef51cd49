"""PyTorch wrapper: ``hvdcompress.torch.DistributedOptimizer`` and helpers.

Migration from Horovod is the import::

    import hvdcompress.torch as hvc
    opt = hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvdcompress.DGC(0.999))
"""
from ..schedule import SparsityScheduler
from .backend import TorchOps
from .collectives import node_process_sets
from .optimizer import DistributedOptimizer, broadcast_optimizer_state

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state", "SparsityScheduler", "TorchOps",
           "node_process_sets"]
