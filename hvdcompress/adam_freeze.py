"""When FrozenAdam updates Adam's second moment v: the variance schedule (0/1 Adam's policy).

A *v-step* runs live Adam on the exchanged mean gradient (sent with the mild warm-up compressor,
int8 by default): m and v are both updated. Every other step is a *compressed step*: the wrapped
compressor sends (with its error feedback), m is updated and v is kept. The schedule depends on
the step count only, so it is the same on every rank without any exchange, needs no read of a
device value, and survives a checkpoint with the step count (``adam_steps``).

Default (0/1 Adam, Lu et al. 2022, "variance update at growing intervals"), step t = 1, 2, ...::

    t <= W                                   every step is a v-step (W = 32)
    then levels L = 0, 1, 2, ...             R = 16 v-steps each, spaced I_L = 2^(L+1) steps

so the v-steps after the warm-up are at t = W + S_L + k·I_L, k = 1..R, with
S_L = R·(2^(L+1) - 2): every 2nd step up to W + 32, every 4th up to W + 96, ... The number of
v-steps up to T grows as W + R·log2((T - W)/(2R) + 1): 111 of 1,000 steps, 142 of 3,000.

A v-step after an interval of I steps stands for those I steps: v decays as Adam's would over
them, with the new gradient's weight bounded so that v stays an average of at least
``min(1/(1-b2), MIN_SAMPLES)`` squared gradients (one gradient's g² is a very noisy estimate of a
coordinate's variance: a near-zero sample would give that coordinate huge steps until the next
refresh)::

    alpha = min(1 - b2^I, max(1 - b2, 1/MIN_SAMPLES));   v <- (1 - alpha)·v + alpha·g²

(I = 1, the warm-up: Adam's own b2·v + (1-b2)·g²), and the bias correction divides by
1 - prod(1 - alpha) over the v-steps so far (Adam's 1 - b2^t when every step is a v-step).

With ``freeze_steps=T0`` (the explicit override): the v-steps are t <= T0 and v is frozen after
them for good (1-bit Adam), bias correction 1 - b2^min(t, T0).
"""
from __future__ import annotations

from typing import Optional

WARMUP = 32        # W: steps of live Adam at the start of the run
PER_LEVEL = 16     # R: v-steps at each interval before it doubles
MIN_SAMPLES = 16   # a v-step's weight alpha stays <= max(1 - b2, 1/MIN_SAMPLES)


class VarianceSchedule:
    """Which steps update v and with which weight (module doc). ``freeze_steps``: None for the
    growing intervals, else the fixed freeze T0."""

    def __init__(self, freeze_steps: Optional[int] = None, warmup: int = WARMUP,
                 per_level: int = PER_LEVEL, min_samples: int = MIN_SAMPLES):
        self.freeze_steps = freeze_steps
        self.warmup, self.per_level, self.min_samples = warmup, per_level, min_samples

    def _level(self, u: int) -> tuple:
        """(S_L, I_L) of the level holding step u = t - W > 0 of the growing intervals."""
        level = 0
        while u > self.per_level * (2 ** (level + 2) - 2):
            level += 1
        return self.per_level * (2 ** (level + 1) - 2), 2 ** (level + 1)

    def updates(self, t: int) -> bool:
        """Whether step t (1-based) is a v-step."""
        if self.freeze_steps is not None:
            return t <= self.freeze_steps
        if t <= self.warmup:
            return True
        start, interval = self._level(t - self.warmup)
        return (t - self.warmup - start) % interval == 0

    def interval(self, t: int) -> int:
        """Steps since the v-step before the v-step t (1 in the warm-up and with freeze_steps)."""
        if self.freeze_steps is not None or t <= self.warmup:
            return 1
        return self._level(t - self.warmup)[1]

    def weights(self, t: int, beta2: float) -> tuple:
        """(keep, alpha) of the v-step t: v <- keep·v + alpha·g²; (b2, 1 - b2) for I = 1."""
        interval = self.interval(t)
        if interval == 1:
            return beta2, 1.0 - beta2
        alpha = min(1.0 - beta2 ** interval, max(1.0 - beta2, 1.0 / self.min_samples))
        return 1.0 - alpha, alpha

    def count(self, t: int) -> int:
        """The number of v-steps among steps 1..t."""
        if self.freeze_steps is not None:
            return min(t, self.freeze_steps)
        if t <= self.warmup:
            return max(t, 0)
        u, n, level = t - self.warmup, self.warmup, 0
        while True:
            start, interval = self.per_level * (2 ** (level + 1) - 2), 2 ** (level + 1)
            if u <= start:
                return n
            n += min(self.per_level, (u - start) // interval)
            level += 1

    def decay(self, t: int, beta2: float) -> float:
        """prod(keep) over the v-steps among 1..t: v's bias correction is 1 - decay. At least one
        step's (b2) so that a v never updated (freeze_steps=0, v = 0) divides by 1 - b2, not 0."""
        if self.freeze_steps is not None:
            return beta2 ** min(t, max(self.freeze_steps, 1))
        out = beta2 ** min(max(t, 1), self.warmup)
        u, level = t - self.warmup, 0
        while u > 0:
            start, interval = self.per_level * (2 ** (level + 1) - 2), 2 ** (level + 1)
            if u <= start:
                break
            n = min(self.per_level, (u - start) // interval)
            out *= self.weights(self.warmup + start + interval, beta2)[0] ** n
            level += 1
        return out
