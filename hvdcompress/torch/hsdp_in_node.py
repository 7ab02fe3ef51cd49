"""HSDP's in-node reduce-scatter compressed: ``fsdp.compress(model, compression=..., intra_node=...)``
on an FSDP2 HSDP model (:mod:`hvdcompress.torch.hsdp`).

FSDP's reduce-scatter over the shard dimension (inside a node) runs through a
:class:`hvdcompress.torch.fsdp.CompressionState` over the shard process group, the FULL_SHARD
path's compressed reduce-scatter installed with ``set_custom_reduce_scatter`` on every
``FSDPModule`` (:class:`~hvdcompress.torch.fsdp_reduce_scatter.CompressedReduceScatter`); the
:class:`~hvdcompress.torch.hsdp.HSDPState` then compresses the all-reduce across replicas of the
shard it hands over. FSDP asks for AVG over the S shard ranks and the replicate all-reduce averages
over the R replicas, so rank (r, j) ends with the mean over the R·S ranks up to the compressors'
errors::

    g_j = 1/R · Σ_r C_x(1/S · Σ_s D(C_i(g_{r,s}))[j])

``C_i`` is the in-node compressor, its state (error feedback) per rank, unit, chunk and block.
This module builds that state (refusing what the sharded reduce-scatter cannot run, naming
``intra_node=``, before FSDP is changed), installs it, and carries it in the HSDPState's checkpoints
(entry ``'in_node'``: this rank's in-node state, or with ``gather=True`` the list over the replicas
of each replica's gathered one, the same on every rank), resumed at the same mesh only.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from ..engines.accounting import ByteCount
from ..transport.objects import allgather_object
from . import fsdp_reduce_scatter
from .dist_collectives import DistCollectives
from .tensors import OPS


def build(factory: Callable[[Any], Any], module: torch.nn.Module, scaler: Any) -> Any:
    """``factory(shard_group)``: the in-node state over the shard dimension of ``module``'s mesh;
    its refusal (:func:`hvdcompress.engines.reduce_scatter.check_sharded`'s) restated for ``intra_node=``."""
    if scaler is not None:
        raise ValueError("compress: intra_node= with scaler= under HSDP: the in-node reduce-scatter would "
                         "compress (and keep residuals of) the scaled gradients; use one of them")
    mesh = next(p.device_mesh for p in module.parameters() if getattr(p, "device_mesh", None) is not None)
    try:
        return factory(mesh.get_group(1))
    except (ValueError, TypeError) as error:
        text = str(error)
        text = "intra_node=" + text[len("compression="):] if text.startswith("compression=") else text
        raise type(error)(f"compress: {text} (under HSDP intra_node= compresses FSDP's reduce-scatter over "
                         "the shard dimension: a compressor the sharded reduce-scatter takes, e.g. Int8(), "
                         "{'compressor': 'bf16'})") from error


def install(module: torch.nn.Module, state: Any) -> None:
    """``state``'s compressed reduce-scatter on every ``FSDPModule`` under ``module``, units named
    as :func:`hvdcompress.torch.fsdp.compress` names them."""
    fsdp_reduce_scatter.install(fsdp_reduce_scatter.units(module), state)


def bytes_of(state: Optional[Any], last: bool = False) -> ByteCount:
    """The in-node reduce-scatter's bytes (zero without one): since construction or the last step."""
    if state is None:
        return ByteCount()
    return state.last_step_bytes if last else state.total_bytes


def save(state: Any, gather: bool, replicate_group: Any, like: torch.Tensor) -> Any:
    """The checkpoint's ``'in_node'`` entry: this rank's state, or every rank's (a collective over
    the shard group, then over ``replicate_group``: a list over the replicas)."""
    if not gather:
        return state.state_dict()
    return allgather_object(state.state_dict(gather=True), DistCollectives(replicate_group), OPS, like)


def chosen(state: Optional[Any], saved: Mapping, mesh: tuple, replica: int, fresh: Any) -> Any:
    """The in-node state this rank loads from the HSDP checkpoint ``saved`` (``mesh``: this run's
    (replicas, shards)): its ``'in_node'`` entry at the same mesh; ``fresh`` (a new state's) when the
    checkpoint has none. A ``ValueError`` (nothing changed) otherwise. Local."""
    entry = saved.get("in_node") if isinstance(saved, Mapping) else None
    if state is None:
        if entry is not None:
            raise ValueError("load_state_dict: this checkpoint holds an in-node reduce-scatter state "
                             "(saved with intra_node=) and this state has none: pass the same intra_node= "
                             "to fsdp.compress, or drop the checkpoint's 'in_node' entry to discard it")
        return None
    if entry is None:
        return fresh   # saved without intra_node= (or the entry dropped): the in-node compressor afresh
    old = saved.get("mesh") if isinstance(saved.get("mesh"), Mapping) else {}
    if (old.get("replicas"), old.get("shards")) != tuple(mesh):
        raise ValueError(f"load_state_dict: an in-node state (intra_node=) resumes at the same mesh only: "
                         f"this checkpoint's is {old.get('replicas')} x {old.get('shards')} (replicas x "
                         f"shards), this run's {mesh[0]} x {mesh[1]}; drop the checkpoint's 'in_node' "
                         "entry to resume the cross-node state alone and start the in-node compressor afresh")
    if isinstance(entry, list):
        if len(entry) != mesh[0]:
            raise ValueError(f"load_state_dict: the checkpoint's 'in_node' entry holds {len(entry)} "
                             f"replicas' states; this mesh has {mesh[0]} replicas")
        return entry[replica]
    return entry


def load(state: Optional[Any], mine: Any, then: Callable[[], None]) -> None:
    """Load ``mine`` into ``state``, then ``then()`` (the cross-node load); if that refuses, ``state``
    is put back: all or nothing."""
    if state is None:
        then()
        return
    before = state.state_dict()
    state.load_state_dict(mine)
    try:
        then()
    except BaseException:
        state.load_state_dict(before)
        raise
