"""Process-set layout for two-level compression: which ranks form a node, which the cross-node
sets, and registering them with Horovod.

With N nodes of L ranks placed node by node (rank = node·L + local rank), two-level
compression (:mod:`hvdcompress.engines.two_level`) runs over N node-local sets ``[k·L, ..., k·L+L-1]``
and L cross-node sets ``[j, j+L, ...]``. Horovod 0.28 wants process sets registered the same
way on every rank: ``hvd.init(process_sets=node_process_sets(hvd))`` (computed from horovodrun's
``HOROVOD_SIZE`` / ``HOROVOD_LOCAL_SIZE`` before ``hvd.init``), or, with
``HOROVOD_DYNAMIC_PROCESS_SETS=1``, by the wrappers when they are built
(:func:`registered_node_sets`).
"""
from __future__ import annotations

import os
from typing import Any, Optional

_SETS: dict = {}   # (size, ranks per node) -> [node sets..., cross sets...] made by node_process_sets


def node_layout(size: int, ranks_per_node: int) -> tuple:
    """``(node_ranks, cross_ranks)``: the N = size / L lists of the ranks of each node
    (``[k·L, ..., k·L + L - 1]``) and the L lists of the ranks with local rank j
    (``[j, j + L, ...]``). A ValueError unless 2 <= L < size and L divides size."""
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) \
            or not 2 <= ranks_per_node < size or size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node!r} with {size} ranks: two-level "
                         "compression needs at least 2 nodes of at least 2 ranks, so allowed: a "
                         f"divisor L of {size} with 2 <= L < {size} (default: Horovod's "
                         "local_size; on one machine pass ranks_per_node= to emulate nodes, or "
                         "use intra_node=None)")
    nodes = size // ranks_per_node
    return ([list(range(k * ranks_per_node, (k + 1) * ranks_per_node)) for k in range(nodes)],
            [list(range(j, size, ranks_per_node)) for j in range(ranks_per_node)])


def _sizes(hvd: Any, ranks_per_node: Optional[int]) -> tuple:
    """(size, ranks per node): Horovod's once initialised, else the launcher's variables."""
    if hvd.is_initialized():
        return hvd.size(), ranks_per_node or hvd.local_size()
    for size_key, local_key in (("HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
                                ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        if size_key in os.environ:
            return int(os.environ[size_key]), ranks_per_node or int(os.environ[local_key])
    raise ValueError("node_process_sets: Horovod is not initialised and HOROVOD_SIZE is not set; "
                     "run under horovodrun (it sets HOROVOD_SIZE and HOROVOD_LOCAL_SIZE), or "
                     "call it after hvd.init() with HOROVOD_DYNAMIC_PROCESS_SETS=1")


def node_process_sets(hvd: Any, ranks_per_node: Optional[int] = None) -> list:
    """The process sets two-level compression runs over: N node-local sets, then L cross-node
    sets (:func:`node_layout`), as ``hvd.ProcessSet`` objects to register on every rank:
    ``hvd.init(process_sets=node_process_sets(hvd))``. The same objects are returned on every
    call, so the wrappers find them registered."""
    size, per_node = _sizes(hvd, ranks_per_node)
    key = (size, per_node)
    if key not in _SETS:
        nodes, cross = node_layout(size, per_node)
        _SETS[key] = [hvd.ProcessSet(ranks) for ranks in nodes + cross]
    return _SETS[key]


def registered_node_sets(hvd: Any, ranks_per_node: Optional[int]) -> tuple:
    """(this rank's node set, its cross-node set), registered with Horovod (initialised). Sets
    not registered yet are added here when dynamic process sets are on (every rank builds the
    wrapper, so every rank adds them, in the same order); otherwise a ValueError says how."""
    size, per_node = hvd.size(), ranks_per_node or hvd.local_size()
    nodes, _ = node_layout(size, per_node)
    sets = node_process_sets(hvd, per_node)
    if any(ps.process_set_id is None for ps in sets):
        call = "" if ranks_per_node is None else f"ranks_per_node={ranks_per_node}"
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0"):
            for ps in sets:
                if ps.process_set_id is None:
                    hvd.add_process_set(ps)
        else:
            raise ValueError(
                f"intra_node=... needs the node and cross-node process sets of {size} ranks in "
                f"nodes of {per_node} registered with Horovod on every rank: call "
                f"hvd.init(process_sets=hvdcompress.torch.node_process_sets({call})) "
                "(or hvdcompress.tensorflow.node_process_sets) instead of hvd.init(), or run with "
                "HOROVOD_DYNAMIC_PROCESS_SETS=1 / hvd.init(process_sets='dynamic') and the "
                "optimizer registers them itself")
    rank = hvd.rank()
    if ranks_per_node is None and (hvd.local_rank(), hvd.cross_rank()) != (rank % per_node, rank // per_node):
        raise ValueError(f"rank {rank} is local rank {hvd.local_rank()} on node {hvd.cross_rank()}, "
                         f"not {rank % per_node} on {rank // per_node}: two-level compression needs "
                         "ranks placed node by node (horovodrun -H host1:L,host2:L,...) with the "
                         "same number L on every node")
    return sets[rank // per_node], sets[len(nodes) + rank % per_node]


