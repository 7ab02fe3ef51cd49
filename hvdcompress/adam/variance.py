"""When FrozenAdam updates Adam's second moment v: the variance schedule (0/1 Adam's policy).

A *v-step* runs live Adam on the exchanged mean gradient (sent with the mild warm-up compressor,
int8 by default): m and v are both updated. Every other step is a *compressed step*: the wrapped
compressor sends (with its error feedback), m is updated and v is kept. The schedule depends on
the step count and b2 only (the param groups', the same on every rank), so it is the same on
every rank without any exchange, needs no read of a device value, and survives a checkpoint with
the step count (``adam_steps``). A bound on v's measured change would not choose better: the
relative change of sqrt(v_hat) over 16 steps is the sampling noise of g² that the bias-corrected
average leaves, ~6/t while t < 1/(1-b2), then a floor (~0.1 at b2 = 0.95), the same curve on
every task measured; a bound on it is a step count, read at the cost of a reduction and a host
read, and one under the floor never leaves the live steps.

Default (0/1 Adam, Lu et al. 2022, "variance update at growing intervals"), step t = 1, 2, ...::

    t <= W                                  every step is a v-step (W = 128; sparsifiers: 256; long: 512)
    then levels L = 0, 1, 2, ...            R = 8 v-steps each, I_L = min(F·2^L, cap) apart (F = 2;
                                            16 after the long warm-up, but a sparsifier's)
    cap = 2^floor(log2(1 / (1 - b2)))       (>= 2): 16 at b2 = 0.95, 64 at 0.99, 512 at 0.999

the last level (I_L = cap) lasting to the end of the run: every 2nd step up to W + 16, every
4th up to W + 48, ... The number of v-steps up to T >> W grows as R·log2((T - W)/R) until the
cap, then as (T - W)/cap: at b2 = 0.999, 173 of 1,000 steps, 187 of 3,000; at b2 = 0.95,
199 of 1,000 (every 16th step after step 240), 324 of 3,000. The cap is beta2's time constant
as a bound: v forgets as fast as Adam's (below), but from one sample per interval, so an
interval longer than 1/(1-b2) would leave whole stretches of the run out of v. A shorter cap
sends more int8 v-steps and, measured at 1/(2(1-b2)), converged worse.

Around a sparsifier (``adam_needs.delivers_late``: top-k, random-k), W = 256 (:data:`LATE_WARMUP`;
``live_steps`` overrides). At k = 1% it sends a coordinate about once in 1/k = 100 steps, its
error feedback delivering the rest late, and a late step costs most while the model still moves
fast, early in the run. 128 more live (int8) steps (299 v-steps of 1,000 at b2 0.999, 319 at
0.95) buy it back for bytes: the int8 v-steps, 1/4 of dense's bytes each, are most of what is
sent, so every step added to W costs the ratio directly (W = 384 would send 1/8.5 of dense's
bytes). Not W growing with 1/k: top-k at k = 0.5% did no better with 384 live steps than 256.

Where v's time constant 1/(1-b2) is over 512 steps (b2 > 0.998, :func:`long_warmup`), top-k
and PowerSGD wait longer, W = 512, and their v-steps send 4-bit min-max codes
(:class:`~hvdcompress.compressors.int8.Int4`, 1/8 of dense's bytes; FrozenAdam's
``warmup="auto"``): at b2 0.999, 256 steps leave v formed to 1 - b2^256 = 23%, 512 to 40%, and
the transition costs less the later and the smaller the learning rate it meets (551 v-steps of
1,000). The trade-off: int4's error per element, (max-min)/30 of its chunk against int8's /510,
for twice the steps at the same bytes (512 int8 steps would send 1/6.8 of dense's bytes). Not
at b2 0.95: v follows ~20 steps there, and with it the 4-bit codes' fixed error.

Onebit takes the long warm-up from 4 ranks on (``OneBit.adam_needs``): after 128 steps its
first compressed steps would meet a v formed to 1 - 0.999^128 = 12%. Its v-steps cross the
compressed allreduce, where the N ranks' int4 errors average (the reduced sum is re-sent in
chunks of 64, :mod:`hvdcompress.adam.frozen`). At 2 ranks onebit keeps 128 int8 steps: there
it meets its target without the long warm-up and misses with it, through the int4 codes (512
int8 steps meet, at too many bytes). Yet int4's error is 1/4 to 1/3 of the mean's sampling
noise at 2, 4 and 8 ranks alike, so a rule on that ratio would choose the same at every world
size; what makes 2 ranks differ is not known.

After the long warm-up the levels start 16 steps apart (:data:`LONG_FIRST`), not 2: v has been
live for 512 steps and needs early refreshes least, while the first levels' 22 int4 v-steps
cost bytes the ratio does not have (529 v-steps of 1,000 instead of 551). Not around a
sparsifier, whose error feedback holds mass back ~1/k steps and needs the early refreshes.

A v-step after an interval of I steps stands for those I steps: v decays as Adam's would over
them, and the new gradient takes the weight that Adam gives the I gradients it skipped::

    alpha = 1 - b2^I;   v <- (1 - alpha)·v + alpha·g²

(I = 1, the warm-up: Adam's own b2·v + (1-b2)·g²), and the bias correction divides by
1 - prod(1 - alpha) over the v-steps so far (Adam's 1 - b2^t when every step is a v-step).
v then forgets as fast as Adam's (its time constant 1/(1-b2) steps), from one sample per
interval instead of I. The cap keeps a single sample's weight at most 1 - b2^cap, about
1 - 1/e = 0.63 (0.56 at b2 = 0.95), so one near-zero g² keeps at least ~0.37 of v. Alpha has
no lower bound: one such as max(1 - b2, 1/16), so that v averages >= 16 squares, makes v span
~128 steps at b2 = 0.95 (alpha 1/16 instead of 0.34 at I = 8), and v then lags behind the
gradients' falling scale.

With ``freeze_steps=T0`` (the explicit override): the v-steps are t <= T0 and v is frozen after
them for good (1-bit Adam), bias correction 1 - b2^min(t, T0).

Evidence: benchmarks/README.md section 8 (Compression with AdamW), "Why the defaults".
"""
from __future__ import annotations

import math
from typing import Optional

WARMUP = 128       # W: steps of live Adam at the start of the run
LATE_WARMUP = 256  # W around a compressor that delivers late, a sparsifier (module doc)
LONG_WARMUP = 512  # W, the long warm-up, where v's time constant 1/(1-b2) is over it (FrozenAdam._follow)
FIRST = 2          # F: the interval of the first level after the warm-up
LONG_FIRST = 16    # F after the long warm-up (module doc)


def long_warmup(beta2: float, short: int) -> int:
    """W around top-k (``short`` 256) or PowerSGD (128) for this b2 (module doc): 512 where
    1/(1 - b2) > 512 (b2 > 0.998), else ``short``."""
    return LONG_WARMUP if beta2 >= 1.0 or 1.0 / (1.0 - beta2) > LONG_WARMUP else short


PER_LEVEL = 8       # R: v-steps at each interval before it doubles (0/1 Adam's levels)


class VarianceSchedule:
    """Which steps update v and with which weight (module doc). ``freeze_steps``: None for the
    growing intervals, else the fixed freeze T0; ``first``: the interval of the first level after
    the warm-up (:data:`FIRST`; :data:`LONG_FIRST` after the long one)."""

    def __init__(self, freeze_steps: Optional[int] = None, warmup: int = WARMUP, first: int = FIRST):
        self.freeze_steps, self.warmup, self.first = freeze_steps, warmup, first

    def cap(self, beta2: float) -> int:
        """The longest interval for this b2: a power of 2, >= 2, <= 1/(1 - b2)."""
        if beta2 >= 1.0:
            return 2 ** 30
        return 2 ** max(1, min(30, math.floor(math.log2(1.0 / (1.0 - beta2)))))

    def _levels(self, beta2: float):
        """(start, interval, last) of each level: its v-steps are at u = start + k·interval,
        k = 1..R (k >= 1 without end for the last, capped, level), u = t - W."""
        cap, start = self.cap(beta2), 0
        interval = min(self.first, cap)
        while interval < cap:
            yield start, interval, False
            start, interval = start + PER_LEVEL * interval, interval * 2
        yield start, cap, True

    def _find(self, u: int, beta2: float) -> tuple:
        for start, interval, last in self._levels(beta2):
            if last or u <= start + PER_LEVEL * interval:
                return start, interval
        raise AssertionError("unreachable")

    def updates(self, t: int, beta2: float) -> bool:
        """Whether step t (1-based) is a v-step."""
        if self.freeze_steps is not None:
            return t <= self.freeze_steps
        if t <= self.warmup:
            return True
        start, interval = self._find(t - self.warmup, beta2)
        return (t - self.warmup - start) % interval == 0

    def interval(self, t: int, beta2: float) -> int:
        """Steps since the v-step before the v-step t (1 in the warm-up and with freeze_steps)."""
        if self.freeze_steps is not None or t <= self.warmup:
            return 1
        return self._find(t - self.warmup, beta2)[1]

    def weights(self, t: int, beta2: float, phase_beta2: Optional[float] = None) -> tuple:
        """(keep, alpha) of the v-step t: v <- keep·v + alpha·g²; (b2, 1 - b2) for I = 1.
        ``phase_beta2``: the b2 that sets the intervals (default: ``beta2``)."""
        return self._weights(self.interval(t, beta2 if phase_beta2 is None else phase_beta2), beta2)

    def _weights(self, interval: int, beta2: float) -> tuple:
        keep = beta2 ** interval
        return keep, 1.0 - keep

    def _counts(self, t: int, beta2: float):
        """(interval, number of v-steps among 1..t) of each level reached (after the warm-up)."""
        u = t - self.warmup
        for start, interval, last in self._levels(beta2):
            if u <= start:
                return
            n = (u - start) // interval
            yield interval, n if last else min(PER_LEVEL, n)

    def count(self, t: int, beta2: float) -> int:
        """The number of v-steps among steps 1..t."""
        if self.freeze_steps is not None:
            return min(t, self.freeze_steps)
        return min(max(t, 0), self.warmup) + sum(n for _, n in self._counts(t, beta2))

    def decay(self, t: int, beta2: float, phase_beta2: Optional[float] = None) -> float:
        """prod(keep) over the v-steps among 1..t: v's bias correction is 1 - decay. At least one
        step's (b2) so that a v never updated (freeze_steps=0, v = 0) divides by 1 - b2, not 0."""
        if self.freeze_steps is not None:
            return beta2 ** min(t, max(self.freeze_steps, 1))
        out = beta2 ** min(max(t, 1), self.warmup)
        for interval, n in self._counts(t, beta2 if phase_beta2 is None else phase_beta2):
            out *= self._weights(interval, beta2)[0] ** n
        return out
