"""What the torch front ends (Horovod optimizer, DDP hook, HSDP) share besides the driver: the
:class:`TensorInfo` of a parameter, FrozenAdam's update of the optimizer's parameters, and the
conversions of torch tensors for checkpoints (:mod:`hvdcompress.state.store`).

A parameter may be a DTensor (FSDP2, HSDP: :mod:`hvdcompress.torch.hsdp`): what is compressed,
updated and checked is then its local shard (:func:`local`), a view of the DTensor's storage;
its name, param group and global shape stay the DTensor's."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..adam.settings import adam_settings
from ..contract.compressor import TensorInfo
from ..engines.fusion import bucket_info
from ..ops.torch_ops import TorchOps
from ..state.store import Conversions
from .momentum_takeover import momentum_fields

OPS = TorchOps()


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (sharing its storage: writes land in the DTensor), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_info(p: torch.Tensor, name: str, world: int, rank: int, group: Optional[dict] = None) -> TensorInfo:
    """``p``'s :class:`TensorInfo` (of its local shard for a DTensor); with ``group`` (its param
    group, when the compressor takes SGD's momentum over) the momentum, Nesterov and weight
    decay read from it now."""
    p = local(p)
    info = TensorInfo(name=name, numel=p.numel(), world=world, rank=rank, shape=tuple(p.shape),
                      param=p.detach().reshape(-1))
    for field, value in (momentum_fields(group).items() if group is not None else ()):
        setattr(info, field, value)
    return info


def adam_update(adam: Any, param_groups: list, state_of: Callable[[torch.Tensor], dict],
                name_of: Callable[[torch.Tensor], str], closure: Optional[Callable] = None) -> Any:
    """The optimizer's step under FrozenAdam: :meth:`hvdcompress.adam.frozen.FrozenAdam.after_exchange`
    for every parameter with a gradient (the exchanged mean), its param group's settings read
    now (schedulers keep working). ``state_of(p)``: its compressor state."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    with torch.no_grad():
        for i, group in enumerate(param_groups):
            settings = adam_settings(group, i)
            for p in (q for q in group["params"] if q.grad is not None):
                if p.grad.is_sparse:
                    raise ValueError(f"parameter '{name_of(p)}' has a sparse gradient, which "
                                     "FrozenAdam cannot take; use sparse_as_dense=True")
                shard = local(p)
                new = adam.after_exchange(OPS, state_of(p), shard.reshape(-1), local(p.grad).reshape(-1), settings)
                shard.copy_(new.view_as(shard))
    return loss


def weak_hook(owner: Any, method: str) -> Callable:
    """A hook calling ``owner.<method>`` that does not keep ``owner`` alive: wrapping a model's
    parameters in a new optimizer leaves the old one collectable, and its hooks inert."""
    ref = weakref.ref(owner)

    def hook(*args: Any) -> Any:
        target = ref()
        return None if target is None else getattr(target, method)(*args)
    return hook


def ranks_of(process_set: Any, global_set: Any) -> Optional[list]:
    """The global ranks of ``process_set``'s members, by index (None: the global set)."""
    return None if process_set is global_set else getattr(process_set, "ranks", None)


def state_layout(driver: Any, params: list, bucket: Any, info_of: Callable) -> tuple:
    """For :func:`hvdcompress.state.store.load`: (numel, a tensor on its device, whether the
    engine runs it as a compressed allreduce) of the state kept for ``params`` (one parameter,
    or ``bucket``'s members; ``info_of(p)``: a parameter's TensorInfo)."""
    p, shard = params[0], local(params[0])
    info = (lambda: bucket_info(bucket, [info_of(q) for q in params], OPS)) if bucket is not None \
        else (lambda: info_of(p))
    return (sum(local(q).numel() for q in params), shard,
            lambda: driver.engine.collective_for(info(), shard.detach().reshape(-1)) == "alltoall")


def _to_numpy(v: torch.Tensor) -> np.ndarray:
    """Host values; bfloat16, which numpy lacks, as float32 (exact)."""
    return (v.float() if v.dtype == torch.bfloat16 else v).detach().cpu().numpy()


CONVERSIONS = Conversions(
    is_tensor=torch.is_tensor,
    copy=lambda v, like: v.detach().clone() if like is None else v.detach().clone().to(like.device),
    host=lambda v: v.detach().cpu().clone(),
    to_numpy=_to_numpy,
    from_numpy=lambda a, like, dtype: torch.from_numpy(np.array(a)).to(like.device, dtype),
    dtype=lambda v: v.dtype,
    numel=lambda v: v.numel())
