"""The step driver: everything one step does around the exchange engine, once, for every front end.

A front end (the Horovod torch optimizer, the DDP hook, the TensorFlow tape and Keras optimizer,
the FSDP hooks) translates its framework's events into the driver's calls and its tensors into
:class:`~hvdcompress.ops.facade.Ops`; it decides nothing itself. One step, in the driver's terms::

    driver.agree(params, like)                 # once per engine: ranks send the same tensors alike
    driver.check_replicas(named)               # every check_replicas steps (hvdcompress.step.replicas)
    before = driver.clips_before()             # the local clip before compression (x clip_scale()), or
                                               # Horovod's after (then clipped_after(coefficient))
    x = driver.outgoing(x, state, info, ...)   # loss-scale guard copy, FrozenAdam's m or g, predivide
    driver.start(entries)                      # a complete group (driver.completion) is launched
    for entry in driver.finish(out_of): ...    # every round, in launch order; decoded averages
    driver.end_exchange()                      # the engine's step end (bytes, plan log)
    driver.end_update(overflow)                # the compressor's step count, unless the step was skipped

The order is the same on every front end: compression state copied for the loss scaler before
anything changes it; FrozenAdam's ``before_exchange`` then the predivide; the clip before
compression with a compressor that carries state (FrozenAdam's compressed steps, each rank
scaled first by the coefficient of its last v-step's clip), Horovod's clip after the exchange
otherwise (FrozenAdam's v-steps included); ``on_step`` after the
update and never on a skipped (overflow) step.

It also owns what spans the run: the engine (built lazily, so a front end's state can exist
before its process group, as PyTorch's PowerSGDState), the rank agreement (at the first step
after each build), the replica guard, the bytes (:attr:`total_bytes`, :attr:`last_step_bytes`:
one :class:`~hvdcompress.engines.accounting.ByteCount` each, the same names on every front end), the
rebuild after a world change, and the per-tensor compressor state with its checkpoints
(:mod:`hvdcompress.state.store`).
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..adam.settings import AdamSettings
from ..contract.compressor import TensorInfo
from ..engines.accounting import ByteCount
from ..engines.exchange import Exchange
from ..engines.fusion import Bucket, compress_bucket
from ..ops.facade import Ops, Tensor
from ..transport.collectives import Collectives, Planner
from .agreement import check_ranks_agree
from .loss_scale import OverflowGuard
from .options import Options
from .replicas import ReplicaCheck, counters_checksum


class Completion:
    """Group (or fused bucket) completion: members report one by one; a group is handed back
    whole when its last member reports (:meth:`add`). Groups whose members did not all report
    are handed back by :meth:`leftovers`, in an order the same on every rank."""

    def __init__(self, sizes: Optional[Mapping[Any, int]] = None):
        self.sizes = dict(sizes or {})
        self._pending: dict = {}

    def add(self, gid: Any, item: Any) -> Optional[list]:
        """Record ``item`` for group ``gid``; its items once the group is complete, else None."""
        items = self._pending.setdefault(gid, [])
        items.append(item)
        if len(items) < self.sizes.get(gid, 1):
            return None
        return self._pending.pop(gid)

    def leftovers(self) -> list:
        """``(gid, items)`` of the incomplete groups, sorted by ``str(gid)``; forgets them."""
        out = [(gid, self._pending[gid]) for gid in sorted(self._pending, key=str)]
        self._pending.clear()
        return out

    def clear(self) -> None:
        self._pending.clear()

    def __bool__(self) -> bool:
        return bool(self._pending)


class TensorStates(dict):
    """Per-tensor compressor state, keyed by tensor name (a parameter, or a fused bucket)."""

    def tensor(self, name: str) -> MutableMapping:
        return self.setdefault(name, {})

    def named(self) -> dict:
        return dict(self)


class StepDriver:
    """The step around the engine (module doc).

    ``engine()``: builds the exchange engine for the current world (called lazily, again after
    :meth:`rebuild`); ``comm()``: the collectives over the front end's process set (metadata:
    agreement, replica check, overflow flag); ``who``: the front end's name in messages;
    ``adam``: the :class:`~hvdcompress.adam.frozen.FrozenAdam` taking the optimizer's step over, or
    None; ``states``: the per-tensor state store (a :class:`TensorStates`, or TensorFlow's
    variables), anything with ``tensor(name)`` and ``named()``; ``ranks``: the global rank of
    each index of the process set, for the replica check's message.
    """

    def __init__(self, options: Options, ops: Ops, engine: Callable[[], Exchange],
                 comm: Callable[[], Collectives], who: str, adam: Any = None,
                 states: Any = None, ranks: Optional[Sequence[int]] = None):
        self.options = options
        self.compressor = options.compressor
        self.ops = ops
        self.who = who
        self.adam = adam
        self.states = TensorStates() if states is None else states
        self.guard: Optional[OverflowGuard] = None   # set with a loss scaler (hvdcompress.step.loss_scale)
        self.completion = Completion()
        self._make_engine = engine
        self._make_comm = comm
        self._ranks = ranks
        self._engine: Optional[Exchange] = None
        self._comm: Optional[Collectives] = None
        self._replicas: Optional[ReplicaCheck] = None
        self._agreed = False
        self.tensors: Optional[list] = None   # (name, shape, dtype) exchanged, sorted (describe)
        self._flights: list = []
        self._total = ByteCount()   # bytes of the engines before the last rebuild

    # ---- what spans the run ----------------------------------------------------------------------
    @property
    def engine(self) -> Exchange:
        """The exchange engine, built at first use (after the process group exists)."""
        if self._engine is None:
            self._engine = self._make_engine()
            self._engine.total_bytes.merge(self._total)
            if self.adam is not None:   # FrozenAdam's warm-up may follow the number of ranks
                self.adam.set_world(self.comm.world)
        return self._engine

    @property
    def comm(self) -> Collectives:
        if self._comm is None:
            self._comm = self._make_comm()
        return self._comm

    @property
    def built(self) -> bool:
        return self._engine is not None

    @property
    def last_step_bytes(self) -> ByteCount:
        """This rank's dense versus sent gradient bytes of the last step."""
        return self.engine.last_step_bytes if self.built else ByteCount()

    @property
    def total_bytes(self) -> ByteCount:
        """This rank's dense versus sent gradient bytes since construction (across rebuilds)."""
        return self.engine.total_bytes if self.built else self._total

    def describe(self, params: Iterable[tuple]) -> None:
        """Record the tensors the front end exchanges, ``(name, shape, dtype)`` (sorted here):
        what :meth:`agree` compares across ranks and what a checkpoint is saved with and
        checked against (:mod:`hvdcompress.state.store`). Called as soon as they are known."""
        self.tensors = sorted((name, tuple(shape), str(dtype)) for name, shape, dtype in params)

    def agree(self, params: Optional[Iterable[tuple]], like: Tensor, **extra: Any) -> None:
        """Once per engine: fail on every rank with one ``ValueError``, naming the setting and
        each rank's value, if ranks disagree on the tensors (``params``, recorded by
        :meth:`describe`; None: those described already) or on any setting of
        :meth:`~hvdcompress.step.options.Options.agreement` (and ``extra``, the front end's own):
        :mod:`hvdcompress.step.agreement`. A collective: every rank calls it at the same point,
        before the exchange's first collective."""
        if self._agreed:
            return
        if params is not None:
            self.describe(params)
        self._agreed = True
        mine = {"params": self.tensors, **self.options.agreement(self.engine), **extra}
        check_ranks_agree(mine, self.comm, self.ops, like, self.who)

    def rebuild(self, blocker: Optional[str] = None) -> None:
        """A new engine for the framework's current world (after ``hvd.shutdown(); hvd.init()``
        at another size: every tensor's collective planned again for the new number of ranks),
        a new replica guard, and the rank agreement again at the next :meth:`agree`. Bytes are
        kept; the compressor state is laid out by loading a gathered checkpoint.
        ``blocker``: why this front end cannot rebuild (a process set, two-level node sets)."""
        if blocker is not None:
            raise ValueError(f"rebuild: {blocker}, which does not survive hvd.shutdown(); "
                             "elastic training needs the global process set and intra_node=None")
        if isinstance(self.compressor, Planner):
            raise ValueError("rebuild: compression='auto' plans for one world size and link; "
                             "elastic training needs a fixed compressor")
        self._total = ByteCount()
        self._total.merge(self.total_bytes)
        self._engine, self._comm, self._replicas, self._agreed = None, None, None, False
        self.clear()

    def clear(self) -> None:
        """Forget any step in progress (a checkpoint load, an elastic reset, a failed step)."""
        self.completion.clear()
        self._flights.clear()

    # ---- one step ------------------------------------------------------------------------------------
    def check_replicas(self, named: Callable[[], Sequence[tuple]]) -> None:
        """Count a step; every ``check_replicas`` steps compare ``named()`` ((name, tensor) in
        name order) and the compressor's counters across ranks (:mod:`hvdcompress.step.replicas`)."""
        if self._replicas is None:
            self._replicas = ReplicaCheck(self.options.check_replicas, self.ops, self.comm, ranks=self._ranks)
        self._replicas.after_step(named, lambda: counters_checksum(
            self.compressor.state_dict(), sorted(self.states.named().items())))

    def clips_before(self) -> bool:
        """Whether ``clip_grad_norm`` clips each rank's gradients before compression, this step
        (:mod:`hvdcompress.step.clipping`): with a compressor that carries state; with FrozenAdam in
        its compressed steps only (its v-steps clip the exchanged mean, as Horovod does, and
        :meth:`clipped_after` keeps the coefficient for :meth:`clip_scale`)."""
        if self.adam is not None and self.options.clip_grad_norm is not None:
            return self.adam.frozen()
        return self.options.clip_before

    def clip_scale(self) -> float:
        """What each rank multiplies its gradients by before its local clip: FrozenAdam's kappa,
        the clip coefficient of the exchanged mean at its last v-step (1.0 before any), so that m
        sees the mean clipped as v did; 1.0 without the take-over."""
        return 1.0 if self.adam is None else self.adam.clip_scale

    def clipped_after(self, coefficient: Any) -> None:
        """Horovod's clip after the exchange scaled the mean by ``coefficient`` (a scalar tensor
        or float, <= 1): under FrozenAdam it is kept as :meth:`clip_scale` (read on the host once
        per v-step); nothing otherwise."""
        if self.adam is not None and coefficient is not None:
            self.adam.clip_scale = coefficient if isinstance(coefficient, float) else self.ops.scalar(coefficient)

    def outgoing(self, x: Tensor, state: MutableMapping, info: TensorInfo,
                 settings: Optional[AdamSettings] = None, param: Optional[Tensor] = None) -> Tensor:
        """What is sent for the flat gradient ``x`` of tensor ``info.name``: with a loss scaler
        its state is copied first (put back if any rank overflows); FrozenAdam's gradient or
        momentum (``settings``: its param group's, ``param``: the flat parameter); divided by
        ``gradient_predivide_factor``."""
        if self.guard is not None:
            self.guard.save(info.name, state)
        if self.adam is not None:
            x = self.adam.before_exchange(self.ops, x, state, settings, param)
            info.dense = self.adam.sends_dense(settings, info.numel)   # live Adam sent dense (warmup="none")
            info.mild = self.adam.sends_mild(settings, info.numel)     # or int8 (FrozenAdam's warm-up compressor)
        if self.options.predivide != 1.0:
            x = x / self.options.predivide
        return x

    def compress(self, key: Any, x: Tensor, info: TensorInfo,
                 settings: Optional[AdamSettings] = None, param: Optional[Tensor] = None) -> Any:
        """:meth:`outgoing`, then the engine's compression of ``x`` (``key``: the front end's
        handle on the result, e.g. the gradient buffer)."""
        state = self.states.tensor(info.name)
        return self.engine.compress(key, self.outgoing(x, state, info, settings, param), state, info)

    def compress_bucket(self, bucket: Bucket, items: Sequence[tuple]) -> Any:
        """A fused bucket's ``(key, x, info)`` items (each through :meth:`outgoing`) compressed
        as one, under the bucket's state (copied first for the loss scaler)."""
        state = self.states.tensor(bucket.name)
        if self.guard is not None:
            self.guard.save(bucket.name, state)
        return compress_bucket(self.engine, bucket, items, state)

    def start(self, entries: list) -> None:
        """Launch compressed entries together (one group's)."""
        if entries:
            self._flights.append(self.engine.start(entries))

    @property
    def in_flight(self) -> bool:
        return bool(self._flights) or bool(self.completion)

    def finish(self, out_of: Callable[[Any], Optional[Tensor]] = lambda e: None) -> list:
        """Every launched group's entries, decoded and averaged, in launch order."""
        done = []
        while self._flights:
            done.extend(self.engine.finish(self._flights.pop(0), out_of))
        return done

    def end_exchange(self) -> None:
        """The exchange of this step is over: the engine counts its bytes and logs its plan."""
        self.engine.end_step()

    def end_update(self, skipped: bool = False) -> None:
        """The update of this step is done: the compressor's step counters advance (warm-up
        schedules, seeds), except on a step every rank skipped (a loss-scale overflow)."""
        if not skipped:
            self.compressor.on_step()
