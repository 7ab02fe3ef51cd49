"""The wrapper core: the arguments every front end shares, each checked and parsed once.

The torch optimizer, the TF tape and the Keras optimizer take Horovod's arguments plus
hvdcompress's own (``compression``, ``clip_grad_norm``, ``collective``, ``intra_node``,
``ranks_per_node``, ``check_replicas``, ``auto_allowed``, ``link``, ``scaler``, ``fusion``). :func:`parse_options` turns
them into one :class:`Options` at construction: a compressor for ``compression`` and
``intra_node`` (dicts go through :func:`hvdcompress.from_params`; ``"auto"`` with
``auto_allowed`` and ``link`` is :class:`hvdcompress.auto.Auto`, which plans at the first
exchange through the engine the front end builds, so front ends only pass the arguments on),
``op`` as ``average``, ``num_groups`` folded into
``groups``; every error names the argument, the value and what is allowed. What follows from
the options is decided here too, the same for every front end:

* :meth:`Options.clip_before`: whether ``clip_grad_norm`` clips each rank's gradients before
  compression (a compressor that carries state) or the exchanged ones after it
  (:mod:`hvdcompress.step.clipping`);
* :meth:`Options.group_ids`: which tensors are launched together, by name;
* :meth:`Options.buckets`: which tensors are compressed as one (``fusion``, :mod:`hvdcompress.engines.fusion`);
* :meth:`Options.agreement`: what every rank must agree on (:mod:`hvdcompress.step.agreement`);
* ``scaler``: the loss scaler whose scale the wrapper divides out before compressing
  (:mod:`hvdcompress.step.loss_scale`), checked against the front end's scaler classes.

A front end keeps only its hooks, variables and collective adapters.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping, Optional, Sequence

from ..contract.compressor import Compressor
from ..contract.validation import is_integer, is_real
from ..engines.fusion import buckets, check_fusion
from ..registry import as_compressor, from_params, is_planner, planner_from_arguments
from .clipping import check_clip_grad_norm, clips_before_exchange
from .replicas import check_every


def check_unwrapped(front_end: str, param: str, value: Any) -> None:
    """A ValueError naming ``param`` where ``value`` (an optimizer, a tape) was returned by a
    front end already, this library's or Horovod's: both make its class in their own module
    (the wrapped class's, with the front end's methods mixed in); twice wrapped, every
    gradient would be exchanged twice."""
    module = type(value).__module__
    if module.split(".")[0] in ("hvdcompress", "horovod"):
        raise ValueError(f"{front_end}: {param}={type(value).__name__} instance is wrapped by "
                         f"{module} already; allowed: the plain {param}, wrapped once (by "
                         f"{front_end} in place of Horovod's)")


def check_intra_node(intra_node: Any) -> Compressor:
    """The ``intra_node`` argument as a compressor (a dict goes through
    :func:`hvdcompress.from_params`); a ValueError for anything the node's reduce-scatter cannot
    run: it needs one round of payloads of a size fixed by the shard's, decoded and summed."""
    if isinstance(intra_node, Mapping):
        intra_node = from_params(intra_node)
    if not isinstance(intra_node, Compressor):
        raise ValueError(f"intra_node={intra_node!r}: allowed: None (the flat exchange) or an "
                         "hvdcompress Compressor for the intra-node level, e.g. NoCompression() "
                         "(full precision), FP16(), BF16(), Int8()")
    if intra_node.takes_over_momentum:
        raise ValueError(f"intra_node={intra_node!r} applies momentum: momentum belongs to the "
                         "compression= compressor (applied once, to the node-summed shard); use "
                         "a mild stateless compressor inside the node (NoCompression, FP16, BF16)")
    if not (intra_node.unwrap().summable_payload or intra_node.supports_alltoall):
        raise ValueError(f"intra_node={intra_node!r}: the node's reduce-scatter sends each shard's "
                         "payload to one local rank (all-to-all), so it needs one round of "
                         "payloads of a size fixed by the shard's that can be decoded and summed: "
                         "NoCompression, FP16, BF16, Int8 or another quantiser; sparsifiers "
                         "(variable size), PowerSGD and CSC (several rounds) and signum (votes) "
                         "belong in compression=")
    return intra_node


@dataclass(frozen=True)
class Options:
    """The parsed arguments of a front end (see :func:`parse_options`)."""

    compressor: Compressor
    average: bool = True                      # op=Average (else Sum)
    backward_passes_per_step: int = 1
    predivide: float = 1.0                    # gradient_predivide_factor
    groups: Any = None                        # None, an int >= 1, or lists of tensors
    sparse_as_dense: bool = False
    clip_grad_norm: Optional[float] = None
    collective: str = "auto"
    intra_node: Optional[Compressor] = None   # two-level compression (hvdcompress.engines.two_level)
    ranks_per_node: Optional[int] = None
    check_replicas: Optional[int] = None
    scaler: Any = None                        # loss scaler (hvdcompress.step.loss_scale)
    fusion: Optional[int] = None              # bytes per fused buffer (hvdcompress.engines.fusion)

    @cached_property
    def clip_before(self) -> bool:
        """Whether ``clip_grad_norm`` clips each rank's gradients before compression (the local
        clip, c·sqrt(N)): with a compressor, or a two-level intra-node one, that carries state.
        Decided once (the torch optimizer asks at every gradient hook)."""
        return self.clip_grad_norm is not None and clips_before_exchange(self.compressor, self.intra_node)

    def group_ids(self, names: Sequence[str], name_of: Callable[[Any], Optional[str]]) -> dict:
        """Tensor name -> group id (a group's payloads are launched together), for the tensors
        ``names``: with ``groups=None`` one group each; ``groups=G`` G groups of consecutive names
        in name order (so every rank and front end groups alike); lists of tensors: those
        groups, every other tensor alone. ``name_of`` maps a listed tensor to its name, to None
        for one not exchanged this time (skipped), or raises for one that is not the wrapper's."""
        ordered = sorted(names)
        if self.groups is None:
            return {n: i for i, n in enumerate(ordered)}
        if isinstance(self.groups, int):
            per = -(-len(ordered) // self.groups) if ordered else 1
            return {n: i // per for i, n in enumerate(ordered)}
        group_of: dict = {}
        for gid, members in enumerate(self.groups):
            for tensor in members:
                name = name_of(tensor)
                if name in group_of:
                    raise ValueError(f"'{name}' appears in more than one group")
                if name is not None:
                    group_of[name] = gid
        return {n: group_of.get(n, f"single.{n}") for n in ordered}

    def buckets(self, tensors: Sequence[tuple]) -> list:
        """The fused buckets (:func:`hvdcompress.engines.fusion.buckets`) of ``tensors`` =
        ``(name, numel, bytes, key)``, where ``key`` holds the dtype and param group (and
        whether FrozenAdam runs the tensor live at every step); none without ``fusion``."""
        if self.fusion is None:
            return []
        live = self.compressor.live if self.compressor.takes_over_adam else None   # its small tensors fuse apart
        return buckets(tensors if live is None else [(n, s, b, (k, live(s))) for n, s, b, k in tensors],
                       self.fusion)

    def agreement(self, exchange: Any) -> dict:
        """Every setting all ranks must share (besides their tensors), named as the argument
        it comes from, for :func:`hvdcompress.step.agreement.check_ranks_agree`; ``exchange`` is
        the built engine. The one place that lists them, for every front end: a rank that
        differs in any of them would hang the exchange (a collective of other payloads, or one
        the others do not run) or train other replicas (a clip, a predivide applied on some
        ranks only). The compressors are their whole tree (:meth:`Compressor.__repr__`)."""
        return {"compression": repr(self.compressor),
                "intra_node": repr(self.intra_node),
                "ranks_per_node": None if self.intra_node is None else exchange.comm.world,
                "collective": exchange.collective,
                "op": "Average" if self.average else "Sum",
                "gradient_predivide_factor": self.predivide,
                "backward_passes_per_step": self.backward_passes_per_step,
                "clip_grad_norm": self.clip_grad_norm,
                "sparse_as_dense": self.sparse_as_dense,
                "groups": [len(g) for g in self.groups] if isinstance(self.groups, list) else self.groups,
                "fusion": self.fusion,
                "check_replicas": self.check_replicas,
                "loss_scaler": self.scaler is not None}   # its overflow flag is a collective


def parse_options(compression: Any = None, *, op: Any, average_op: Any, sum_op: Any,
                  backward_passes_per_step: int = 1, gradient_predivide_factor: float = 1.0,
                  num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                  clip_grad_norm: Optional[float] = None, collective: str = "auto",
                  intra_node: Any = None, ranks_per_node: Optional[int] = None,
                  check_replicas: Optional[int] = None, process_set: Any = None,
                  global_set: Any = None, auto_allowed: Any = None, link: Any = None,
                  scaler: Any = None, scaler_types: tuple = (), fusion: Any = None,
                  set_argument: tuple = ("process_set", "hvd.global_process_set")) -> Options:
    """:class:`Options` from a front end's keyword arguments. ``average_op`` / ``sum_op`` are the
    framework's ``hvd.Average`` / ``hvd.Sum``; ``process_set`` / ``global_set`` the one given
    and Horovod's global set (two-level runs over the global set only); ``auto_allowed`` and
    ``link`` go with ``compression="auto"`` (:mod:`hvdcompress.auto`); ``scaler`` must be None
    or an instance of one of ``scaler_types`` (the front end's loss scalers); ``fusion``: None,
    True or bytes per fused buffer (:func:`hvdcompress.engines.fusion.check_fusion`);
    ``set_argument``: how the front end spells ``process_set`` and its all-ranks value, for messages."""
    auto = planner_from_arguments(compression, auto_allowed, link)
    compressor = as_compressor(compression) if auto is None else auto
    if is_planner(compressor) and (collective != "auto" or intra_node is not None):
        raise ValueError(f"compression={compression!r} with collective={collective!r} and "
                         f"intra_node={intra_node!r}: auto picks each tensor's collective on the "
                         "flat exchange; allowed: collective='auto' and intra_node=None")
    if op not in (average_op, sum_op):
        raise ValueError(f"op={op!r}: allowed: hvd.Average or hvd.Sum (Adasum, Min, Max and "
                         "Product do not combine with compression)")
    average = op == average_op
    factor = gradient_predivide_factor
    if not is_real(factor) or not 0 < factor < math.inf:
        raise ValueError(f"gradient_predivide_factor={factor!r}: allowed: a number > 0")
    if factor != 1.0 and not average:
        raise ValueError(f"gradient_predivide_factor={factor!r} needs op=hvd.Average (got op={op!r})")
    passes = backward_passes_per_step
    if not is_integer(passes) or passes <= 0:
        raise ValueError(f"backward_passes_per_step={passes!r}: allowed: an integer >= 1")
    if num_groups:
        warnings.warn("num_groups is deprecated, use groups", DeprecationWarning, stacklevel=3)
        groups = groups if groups is not None else num_groups
    valid_int = is_integer(groups) and groups > 0
    valid_list = isinstance(groups, list) and all(isinstance(g, (list, tuple)) for g in groups)
    if groups is not None and not (valid_int or valid_list):
        raise ValueError(f"groups={groups!r}: allowed: None, a positive integer, or a list of lists "
                         "of parameters (variables)")
    if not isinstance(sparse_as_dense, bool):
        raise ValueError(f"sparse_as_dense={sparse_as_dense!r}: allowed: True or False")
    if scaler is not None and not isinstance(scaler, scaler_types):
        allowed = " or ".join(f"{t.__module__}.{t.__qualname__}" for t in scaler_types)
        raise ValueError(f"scaler={scaler!r}: allowed: None or a {allowed} (the loss scaler "
                         "whose scale is divided out before compression)")
    intra = None
    if intra_node is None:
        if ranks_per_node is not None:
            raise ValueError(f"ranks_per_node={ranks_per_node!r} without intra_node: the nodes "
                             "matter to two-level compression only; pass intra_node=... (e.g. "
                             "NoCompression() or FP16()) or leave ranks_per_node at None")
    else:
        intra = check_intra_node(intra_node)
        if process_set is not global_set:
            name, default = set_argument
            raise ValueError(f"intra_node={intra!r} with {name}={process_set}: two-level "
                             "compression runs over all ranks (its own node and cross-node "
                             f"process sets); use {name}={default} or intra_node=None")
    return Options(compressor=compressor, average=average, backward_passes_per_step=int(passes),
                   predivide=float(factor), groups=int(groups) if valid_int else groups,
                   sparse_as_dense=sparse_as_dense,
                   clip_grad_norm=check_clip_grad_norm(clip_grad_norm, compressor),
                   collective=collective, intra_node=intra, ranks_per_node=ranks_per_node,
                   check_replicas=check_every(check_replicas), scaler=scaler,
                   fusion=check_fusion(fusion, compressor, groups))
