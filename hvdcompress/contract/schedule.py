"""Sparsity warm-up schedules (DGC §3.3; Paddle's DGCMomentumOptimizer).

Sending everything at once from the first step hurts early training, when gradients change
fast. A warm-up starts dense and tightens to the target:

* :class:`ExponentialWarmup`: the density (1 - sparsity) shrinks geometrically,
  ``density_t = target_density ** ((t + 1) / length)`` for ``t < length``, then the target.
  For target 0.999 over 5 units: 75%, 93.7%, 98.4%, 99.6%, 99.9%: the DGC paper's four warm-up
  epochs (its reference code's ``warmup_epochs=4``; ``from_params``'s ``warmup_epochs=4``).
* :class:`ListWarmup`: an explicit list, Paddle style: dense before ``begin``; from ``begin``
  the list is walked evenly over ``length`` units; after that its last value (Paddle), or the
  target with ``to_target=True`` (the DGC reference code's list of warm-up ratios).

``t`` counts epochs or optimizer steps, as the owner decides (``unit``). From strings
(``warmup_epochs``, ``warmup_steps``, ``warmup_sparsities``...) see :mod:`hvdcompress.registry`.

A compressor with a warm-up mixes in :class:`SparsityWarmup` (``supports_warmup``); callers find
it with ``compressor.unwrap()`` and ask ``supports_warmup``, never by probing attributes.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .compressor import Compressor
from .validation import check_bool, check_choice, check_int, check_range


class Schedule:
    """Maps a step or epoch count to a sparsity in [0, 1)."""

    def __init__(self, unit: str):
        self.unit = check_choice(type(self).__name__, "unit", unit, ("epoch", "step"))

    def sparsity(self, t: int, target: float) -> float:
        raise NotImplementedError


class ExponentialWarmup(Schedule):
    """Geometric ramp of the density to the target over ``length`` units: the last of them
    (``t = length - 1``) is at the target, so ``length - 1`` units are below it."""

    def __init__(self, length: int, unit: str = "epoch"):
        super().__init__(unit)
        self.length = check_int("ExponentialWarmup", "length", length, 1)

    def sparsity(self, t: int, target: float) -> float:
        if t >= self.length:
            return target
        return 1.0 - (1.0 - target) ** ((t + 1) / self.length)

    def __repr__(self) -> str:
        return f"ExponentialWarmup(length={self.length}, unit={self.unit!r})"


class ListWarmup(Schedule):
    """Paddle's ``sparsity`` list with ``rampup_begin_step`` (``begin``) and ``rampup_step``
    (``length``): at ``begin <= t < begin + length`` the entry ``⌊(t - begin)·n / length⌋`` of
    the ``n`` sparsities, which may not decrease; 0 before; after, the last entry, or the
    target with ``to_target=True``. With ``begin=0``, ``length=n`` and ``to_target=True`` each
    entry lasts one unit and the target follows, as in the DGC reference code."""

    def __init__(self, sparsities: Sequence[float], begin: int = 0, length: int = 1,
                 unit: str = "step", to_target: bool = False):
        super().__init__(unit)
        if not sparsities:
            raise ValueError("ListWarmup: sparsities=[] is empty; allowed: a non-empty list of "
                             "numbers in [0, 1)")
        self.sparsities = [check_range("ListWarmup", "sparsities", s, 0.0, 1.0, high_open=True)
                           for s in sparsities]
        for before, after in zip(self.sparsities, self.sparsities[1:]):
            if after < before:
                raise ValueError(f"ListWarmup: sparsities={self.sparsities} decreases ({after} "
                                 f"after {before}); allowed: a non-decreasing list")
        self.begin = check_int("ListWarmup", "begin", begin, 0)
        self.length = check_int("ListWarmup", "length", length, 1)
        self.to_target = check_bool("ListWarmup", "to_target", to_target)

    def sparsity(self, t: int, target: float) -> float:
        if t < self.begin:
            return 0.0
        if t >= self.begin + self.length:
            return target if self.to_target else self.sparsities[-1]
        return self.sparsities[(t - self.begin) * len(self.sparsities) // self.length]

    def __repr__(self) -> str:
        return (f"ListWarmup({self.sparsities}, begin={self.begin}, length={self.length}, "
                f"unit={self.unit!r}, to_target={self.to_target})")


class SparsityWarmup:
    """Mixin for a compressor whose sparsity ramps up (``supports_warmup``), and the one
    step-counter policy for compressor-wide schedules.

    Counters: ``_step`` counts optimizer steps (:meth:`on_step`, called by the framework wrapper
    once per step after the exchange); ``_epoch`` is the epoch given to :meth:`set_epoch` (by
    :class:`SparsityScheduler` or the Keras callback). Both are the compressor's
    :meth:`state_dict`, identical on every rank. Per-tensor draws count their tensor's own
    compressions instead (:func:`hvdcompress.contract.keys.advance_step`). ``warmup`` (a
    :class:`Schedule` or None) reads the counter of its ``unit``; the subclass gives
    :attr:`target_sparsity`.
    """

    supports_warmup = True

    def init_warmup(self, owner: str, warmup: Optional[Schedule]) -> None:
        """Set the schedule (checked) and zero the counters."""
        if warmup is not None and not isinstance(warmup, Schedule):
            raise ValueError(f"{owner}: warmup={warmup!r} is not a schedule; allowed: None, "
                             "ExponentialWarmup(...) or ListWarmup(...)")
        self.warmup = warmup
        self._step = 0
        self._epoch = 0

    @property
    def target_sparsity(self) -> float:
        """The sparsity after warm-up (the fraction of elements not sent)."""
        raise NotImplementedError

    @property
    def current_sparsity(self) -> float:
        """The sparsity in force now, after warm-up."""
        if self.warmup is None:
            return self.target_sparsity
        t = self._epoch if self.warmup.unit == "epoch" else self._step
        return self.warmup.sparsity(t, self.target_sparsity)

    def on_step(self) -> None:
        self._step += 1

    def set_epoch(self, epoch: int) -> None:
        self._epoch = check_int(f"{type(self).__name__}.set_epoch", "epoch", epoch, 0)

    def state_dict(self) -> dict:
        return {"step": self._step, "epoch": self._epoch}

    def load_state_dict(self, state: dict) -> None:
        self._step, self._epoch = int(state["step"]), int(state["epoch"])


class SparsityScheduler:
    """Drives a compressor's epoch-based warm-up from a plain training loop, like an LR
    scheduler: call :meth:`step` once at the end of every epoch::

        dgc = DGC(0.999, warmup=ExponentialWarmup(5))
        sched = SparsityScheduler(dgc)
        for epoch in range(epochs):
            train_one_epoch()
            sched.step()

    ``compressor`` may also be an optimizer wrapped by hvdcompress (its compressor is used).
    Its state (the epoch) is in :meth:`state_dict`.
    """

    def __init__(self, compressor: Any, last_epoch: int = 0):
        self.compressor = getattr(compressor, "_compression", compressor)
        if not isinstance(self.compressor, Compressor):
            raise TypeError(f"SparsityScheduler: {compressor!r} is neither a compressor nor an "
                            "hvdcompress optimizer")
        self.last_epoch = check_int("SparsityScheduler", "last_epoch", last_epoch, 0)
        self.compressor.set_epoch(self.last_epoch)

    def step(self) -> None:
        self.last_epoch += 1
        self.compressor.set_epoch(self.last_epoch)

    def get_sparsity(self) -> Optional[float]:
        """The compressor's current sparsity (None for compressors without one)."""
        algorithm = self.compressor.unwrap()
        return algorithm.current_sparsity if algorithm.supports_warmup else None

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"])
        self.compressor.set_epoch(self.last_epoch)
