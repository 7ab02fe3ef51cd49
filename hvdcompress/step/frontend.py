"""The front-end contract: one step's sequence, in code, that every front end fills in.

A front end (the Horovod torch optimizer, the DDP hook, HSDP, FSDP's reduce-scatter, the
TensorFlow exchange of the tape and Keras; a toy one in tests/toy_front_end.py)
subclasses :class:`FrontEnd` and writes only what is its framework's: where a tensor's gradient
is and what it is called (:meth:`~FrontEnd.name`, :meth:`~FrontEnd.gradient`,
:meth:`~FrontEnd.info`), how gradients are clipped and written back (:meth:`~FrontEnd.clip_local`,
:meth:`~FrontEnd.clip_mean`, :meth:`~FrontEnd.write`), and when its framework says a gradient is
complete. The order of one step is this module's, for all of them::

    ready(keys)     # keys whose gradients are complete, as the framework hands them over
                    #   unscaled (a loss scaler), then compressed and launched now, or held
                    #   until :meth:`wait` when the clip comes first (it needs every norm)
    drain()         # optional, mid-step: every launched round finished and written back now
    wait()          # the held keys clipped together in name order, scaled by the driver's
                    #   clip_scale(), and launched; incomplete groups launched (or refused);
                    #   the ranks' overflow flag sent; every round finished and written back,
                    #   in launch order; the overflow settled; Horovod's clip of the mean;
                    #   the engine's step end. Returns whether every rank skips the step.
    updated(skipped)# after the optimizer's update: the compressor's step count (not on a
                    #   skipped step), then the replica check

Groups: :meth:`~FrontEnd.group` puts a key in a completion group (``groups=``, a fused bucket of
:attr:`~FrontEnd.buckets`); a group is launched when its last member is ready, a fused bucket
compressed as one. Keys handed over together whose groups are complete are launched together.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

from ..adam.settings import AdamSettings
from ..contract.compressor import TensorInfo
from ..engines.fusion import Bucket
from ..ops.facade import Tensor
from .driver import StepDriver


class FrontEnd(ABC):
    """A front end of the step driver (module doc). Subclasses set :attr:`driver` (and, with a
    loss scaler, :attr:`scaler`; with ``fusion=``, :attr:`buckets`) and implement the abstract
    members; the sequence (:meth:`ready`, :meth:`wait`, :meth:`updated`) is not overridden."""

    #: with ``scaler=``: ``launch(comm)``/``settle(comm, handle)`` (step.loss_scale's link)
    scaler: Any = None
    #: fused buckets by name (``fusion=``): a group of that name is compressed as one (read only)
    buckets: Mapping = {}

    def __init__(self, driver: StepDriver):
        self.driver = driver
        self._held: list = []   # batches of keys held for the clip before compression
        self._sent: list = []   # keys compressed (or sent apart) this step

    # ---- what the framework fills in -------------------------------------------------------------
    @abstractmethod
    def name(self, key: Any) -> str:
        """The tensor's name (the state's key, the order of every loop over several tensors)."""

    @abstractmethod
    def gradient(self, key: Any) -> Tensor:
        """The key's local gradient as a flat tensor of the Ops (zeros when it has none)."""

    @abstractmethod
    def info(self, key: Any) -> TensorInfo:
        """What the compressor is told of the tensor (:class:`~hvdcompress.contract.compressor.TensorInfo`)."""

    @abstractmethod
    def clip_local(self, keys: Sequence[Any], scale: float) -> None:
        """Clip the gradients of ``keys`` (in name order) before compression, each rank to its
        share of ``clip_grad_norm`` after multiplying them by ``scale``
        (:mod:`hvdcompress.step.clipping`)."""

    @abstractmethod
    def clip_mean(self, keys: Sequence[Any]) -> Any:
        """Horovod's clip of the exchanged mean of ``keys`` (name order); its coefficient."""

    @abstractmethod
    def write(self, entry: Any) -> None:
        """Put a finished entry's decoded average where the framework reads it."""

    def settings(self, key: Any) -> Optional[AdamSettings]:
        """The key's param group settings, read by a take-over of Adam (None without one)."""
        return None

    def group(self, key: Any) -> Optional[Hashable]:
        """The key's completion group (None: launched as soon as it is handed over)."""
        return None

    def out_of(self, entry: Any) -> Optional[Tensor]:
        """The buffer an entry decodes into (None: one of the engine's)."""
        return None

    def sent_apart(self, key: Any) -> bool:
        """Whether the front end sends this key itself (Horovod's sparse allreduce): not compressed."""
        return False

    def unscale(self, key: Any) -> None:
        """Divide the key's gradient by the loss scale (with :attr:`scaler`)."""

    @property
    def in_progress(self) -> bool:
        """Whether a step has begun (a gradient handed over) and not ended (:meth:`wait`)."""
        return bool(self._held or self._sent) or self.driver.in_flight

    def forget(self) -> None:
        """Drop the step in progress (a failed step, a checkpoint load): the driver's too."""
        self._held, self._sent = [], []
        self.driver.clear()

    def incomplete(self, leftovers: list) -> None:
        """Groups with members that were not handed over this step, ``(gid, items)`` in an order
        the same on every rank: launched as they are (Horovod's optimizer); a front end may refuse."""
        for gid, items in leftovers:
            self.driver.start(self._group_entries(gid, items))

    def received(self) -> None:
        """After every round is written back: what the front end sent apart, collected."""

    # ---- the sequence ------------------------------------------------------------------------------
    def ready(self, keys: Sequence[Any]) -> None:
        """``keys`` have complete gradients (one hook's, one bucket's, or all of them)."""
        for key in keys:
            if self.scaler is not None:
                self.unscale(key)
        if self.driver.clips_before():
            self._held.append(list(keys))
        else:
            self._send(keys)

    def wait(self) -> bool:
        """Everything after the last :meth:`ready` of the step (module doc); whether every rank
        skips this step's update (a loss-scale overflow on some rank)."""
        held, self._held = self._held, []
        if held:
            self.clip_local(sorted((k for batch in held for k in batch), key=self.name), self.driver.clip_scale())
            for batch in held:
                self._send(batch)
        driver = self.driver
        self.incomplete(driver.completion.leftovers())
        overflow = self.scaler.launch(driver.comm) if self.scaler is not None else None
        self.drain()
        self.received()
        skipped = overflow is not None and self.scaler.settle(driver.comm, overflow)
        keys, self._sent = sorted(self._sent, key=self.name), []
        if driver.options.clip_grad_norm is not None and not driver.clips_before():
            driver.clipped_after(self.clip_mean(keys))
        driver.end_exchange()
        return skipped

    def drain(self) -> None:
        """Finish every launched round now and write it back, in launch order (a front end whose
        framework waits for each collective, FSDP's reduce-scatter; :meth:`wait` calls it too)."""
        for entry in self.driver.finish(self.out_of):
            self.write(entry)

    def updated(self, skipped: bool = False, named: Optional[Callable[[], Sequence[tuple]]] = None) -> None:
        """The optimizer's update is done: the compressor's step count (unless ``skipped``),
        then, with ``named`` (``(name, tensor)`` in name order), the replica check."""
        self.driver.end_update(skipped)
        if named is not None:
            self.driver.check_replicas(named)

    # ---- inside the sequence -------------------------------------------------------------------------
    def _send(self, keys: Sequence[Any]) -> None:
        """Compress ``keys`` through the driver; launch together those whose group is complete."""
        entries = []
        for key in keys:
            self._sent.append(key)
            if self.sent_apart(key):
                continue
            gid = self.group(key)
            item = self._compress(key, gid in self.buckets)
            if gid is None:
                entries.append(item)
                continue
            members = self.driver.completion.add(gid, item)
            if members is not None:
                entries.extend(self._group_entries(gid, members))
        self.driver.start(entries)

    def _compress(self, key: Any, bucketed: bool) -> Any:
        """The key's entry, or with a fused bucket its ``(key, outgoing gradient, info)``."""
        info = self.info(key)
        settings = self.settings(key)
        if not bucketed:
            return self.driver.compress(key, self.gradient(key), info, settings, info.param)
        # a member's own state only holds the Adam take-over's moments: none is made without it
        state = self.driver.states.tensor(info.name) if settings is not None else {}
        return key, self.driver.outgoing(self.gradient(key), state, info, settings, info.param), info

    def _group_entries(self, gid: Hashable, items: list) -> list:
        bucket: Optional[Bucket] = self.buckets.get(gid)
        return list(items) if bucket is None else [self.driver.compress_bucket(bucket, items)]
