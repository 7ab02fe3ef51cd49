"""Engine selection, once for every front end: :func:`select_engine` picks the flat exchange,
the compressed reduce-scatter (sharded front ends) or the two-level form of either;
:func:`build_exchange` is the Horovod route to it (process sets registered with Horovod)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..contract.compressor import Compressor
from ..ops.facade import Ops
from ..transport.collectives import Collectives
from ..transport.process_sets import registered_node_sets
from .contract import Engine
from .exchange import Exchange
from .reduce_scatter import ReduceScatterExchange
from .two_level import two_level


def select_engine(compressor: Compressor, ops: Ops, comm: Collectives, *,
                  intra_node: Optional[Compressor] = None,
                  node_comms: Optional[Callable[[], Tuple[Collectives, Collectives]]] = None,
                  average: bool = True, predivide: float = 1.0, collective: str = "auto",
                  everyone: Optional[Collectives] = None, sharded: bool = False,
                  block: int = 4096) -> Engine:
    """The engine a front end runs, chosen here once for all of them.

    ``sharded`` (FSDP): the compressed reduce-scatter in blocks of ``block`` elements, else the
    flat exchange. ``intra_node``: the two-level form of either, over the node and cross-node
    collectives that ``node_comms()`` builds (called only then); ``everyone``: the collectives
    of all ranks (the two-level exit barrier). The other arguments are
    :class:`hvdcompress.step.options.Options`' (checked there)."""
    if intra_node is not None and node_comms is None:
        raise ValueError(f"intra_node={intra_node!r}: the front end gave no node collectives")
    if intra_node is not None:
        return two_level(compressor, intra_node, ops, node_comms, sharded=sharded, average=average,
                         predivide=predivide, collective=collective, everyone=everyone, block=block)
    if sharded:
        return ReduceScatterExchange(compressor, ops, comm, block)
    return Exchange(compressor, ops, comm, average, predivide, collective)


def build_exchange(hvd: Any, collectives: Callable[[Any], Collectives], process_set: Any,
                   compressor: Compressor, ops: Ops, *, intra_node: Optional[Compressor] = None,
                   ranks_per_node: Optional[int] = None, average: bool = True,
                   predivide: float = 1.0, collective: str = "auto") -> Engine:
    """The engine a framework wrapper runs: the flat :class:`Exchange` over ``process_set`` when
    ``intra_node`` is None, else the :class:`~hvdcompress.engines.two_level.TwoLevel` over this rank's node and
    cross-node process sets (registered, see :func:`registered_node_sets`). ``hvd`` is the
    framework's Horovod module, ``collectives(process_set)`` its adapter; the arguments are
    :class:`hvdcompress.step.options.Options`' (checked there)."""
    def node_comms() -> tuple:
        return tuple(collectives(s) for s in registered_node_sets(hvd, ranks_per_node))

    return select_engine(compressor, ops, collectives(process_set), intra_node=intra_node,
                         node_comms=node_comms, average=average, predivide=predivide,
                         collective=collective,
                         everyone=None if intra_node is None else collectives(hvd.global_process_set))
