"""PyTorch wrapper: ``hvdcompress.torch.DistributedOptimizer`` and helpers.

Migration from Horovod is the import::

    import hvdcompress.torch as hvc
    opt = hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvdcompress.DGC(0.999))

Horovod is imported only by what needs it (PEP 562 lazy attributes): the DDP communication hook
(:mod:`hvdcompress.torch.ddp`), :class:`DiLoCo` over torch.distributed and :class:`TorchOps` run
without Horovod installed.
"""
import importlib
from typing import Any

from ..contract.schedule import SparsityScheduler
from ..ops.torch_ops import TorchOps

_HOROVOD_ATTRIBUTES = {"DistributedOptimizer": "optimizer", "broadcast_optimizer_state": "checkpoints",
                       "node_process_sets": "collectives", "DiLoCo": "diloco"}

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state", "SparsityScheduler", "TorchOps",
           "node_process_sets", "DiLoCo"]


def __getattr__(name: str) -> Any:
    """The Horovod front end's names, and submodules (``hvc.collectives``), on first use."""
    module = _HOROVOD_ATTRIBUTES.get(name)
    if module is not None:
        return getattr(importlib.import_module(f".{module}", __name__), name)
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
