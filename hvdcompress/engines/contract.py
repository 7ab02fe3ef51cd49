"""The engine contract: what a front end's step driver asks of whichever engine runs the step.

One tensor's step through an engine::

    entry = engine.compress(key, x, state, info)  # compress (buffers in ``state``), pick the collective
    flight = engine.start([entry, ...])         # launch the collectives (asynchronous)
    done = engine.finish(flight, out_of)        # wait, run further rounds, decode, scale
    engine.end_step()                            # close the step's bytes (last_step_bytes, total_bytes)

``compressor`` is what the engine compresses with, ``comm`` the collectives of its process set
(the agreement's ranks), ``collective`` the per-rank payloads' collective ('auto', 'allgather',
'alltoall'), ``plan`` the per-tensor collective plan (name -> numel, collective, payload bytes,
wire bytes). The flat :class:`~hvdcompress.engines.exchange.Exchange`, the sharded
:class:`~hvdcompress.engines.reduce_scatter.ReduceScatterExchange` and the two-level composer of
either, :class:`~hvdcompress.engines.two_level.TwoLevel`, implement it;
:func:`hvdcompress.engines.selection.select_engine` picks one, for every front end.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, MutableMapping, Optional

from ..contract.compressor import Compressor, TensorInfo
from ..ops.facade import Tensor
from ..transport.collectives import Collectives
from .accounting import ByteCount


class Engine(ABC):
    """Compress, communicate, decode: one step's exchange of a front end's tensors."""

    compressor: Compressor
    comm: Collectives
    collective: str
    plan: dict
    last_step_bytes: ByteCount
    total_bytes: ByteCount

    @abstractmethod
    def compress(self, key: Any, x: Tensor, state: MutableMapping, info: TensorInfo) -> Any:
        """One tensor's outgoing entry (``key``: the front end's handle of the tensor)."""

    @abstractmethod
    def start(self, entries: list) -> Any:
        """Launch the collectives of ``entries``; what :meth:`finish` waits on."""

    @abstractmethod
    def finish(self, flight: Any, out_of: Callable[[Any], Optional[Tensor]] = lambda e: None) -> list:
        """Wait for ``flight``, run further rounds, decode: the finished entries (``entry.total``
        the averaged or summed tensor, written into ``out_of(entry)`` when it gives a buffer)."""

    @abstractmethod
    def end_step(self) -> None:
        """Close the step: ``last_step_bytes`` is this step's, ``total_bytes`` adds it."""
