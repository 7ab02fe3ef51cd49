"""The Adam take-over: compression that converges with Adam and AdamW (1-bit / 0/1 Adam style).

Adam divides each coordinate by its running RMS, sqrt(v). Compressing the gradient next to a
live v fails twice: the compression error of quiet coordinates is amplified by 1/sqrt(v), and
error feedback delivers its delayed mass into a preconditioner that has moved on meanwhile.
1-bit Adam (Tang et al., ICML 2021) observed that v stabilises early, so after a warm-up it
can be frozen; Adam is then a momentum method with a fixed per-coordinate scale, linear in the
exchanged quantity, and error feedback works again. 0/1 Adam (Lu et al., 2022) keeps updating v
at growing intervals instead of freezing it once. What :class:`FrozenAdam` runs, per tensor,
with b1, b2, eps, lr, weight decay λ read from the optimizer's param group at every step, in
two kinds of steps chosen by :mod:`hvdcompress.adam.variance` (the variance schedule):

v-steps (live Adam on the averaged gradient; the first 128 steps, then refreshes)::

    every rank sends its gradient g_r with the warm-up compressor W (int8 by default, stateless;
    dense where the wrapped compressor sends 16 bits or more);  g = mean_r D(W(g_r))
    m <- b1·m + (1-b1)·g;   v <- keep·v + alpha·g²      (b2 and 1-b2 in the warm-up)

compressed steps (v kept), ``send="gradient"`` (the default but for top-k): each rank's gradient,
in lr units (u = lr/L, L the first compressed step's lr), is compressed by the wrapped compressor
(with its error feedback: the residual holds u·g, a displacement over L, untouched by the
v-steps) and the momentum is formed from the exchanged mean::

    g = mean_r D(C(u·g_r)) / u        the exchange (allgather, compressed allreduce, two-level...)
    m <- b1·m + (1-b1)·g

or, with ``send="momentum"`` (1-bit Adam's placement), each rank's own momentum (lr units)::

    m_r = b1·m + (1-b1)·g_r;   m <- mean_r D(C(u·m_r)) / u

Why lr units (EF-SGD's p = lr·g + e): mass that waits in the residual is applied at the lr it
was computed with, not a later, smaller one (u = 1 at a constant lr).

then in both kinds, as torch.optim.Adam/AdamW, v's bias correction over the v-steps so far::

    w <- w·(1 - lr·λ)  (AdamW);   w <- w - lr · (m / (1-b1^t)) / (sqrt(v / (1 - decay_t)) + eps)

except that in a compressed step a coordinate whose v is 0 (no gradient in any v-step so far:
an unused embedding row, an always-zero pixel) is not updated: the compression error it gets
(onebit's ±scale) over eps would move it ~1e8 steps at once (NaN on digits). DeepSpeed's 1-bit
Adam asks the user for such a mask (``exp_avg_mask``); here it is v = 0.

The schedule (:mod:`hvdcompress.adam.variance`): v-steps at t <= 128, then 8 each 2, 4, 8, ...
steps apart up to 1/(1-b2) (173 v-steps of 1,000 at b2 = 0.999, 199 at 0.95); a refresh after
I steps weighs alpha = 1 - b2^I, decay_t = prod(1 - alpha) (b2^t if every step is a v-step).
``freeze_steps=T0``: v-steps t <= T0, v frozen after (1-bit Adam), decay_t = b2^min(t, T0).
``min_numel=n`` (``adam_min_numel``): tensors under n elements run live Adam at every step (off).

Why this rule: a single freeze at ceil(q / (1-b2)) comes before v has formed where b2 is small
(step 15 at b2 = 0.95, q = 0.75) and keeps most of the run dense where it is large (750 of 1,000
steps at 0.999); refreshes at growing intervals avoid both. The step count decides, no
statistic of v (a reduction over every tensor and a host read), so every rank and front end
(:class:`hvdcompress.step.driver.StepDriver`) takes the same steps without an exchange; v follows
the gradients from one sample per interval, and the EF residual meets its refreshes.

Why int8 for the v-steps: 4x fewer bytes, stateless (the decoded mean is the gradient up to
(max-min)/510 per element); int4 (8x) for the long warm-up at b2 > 0.998 (top-k, PowerSGD, onebit
from the ranks its ``adam_needs`` names: :mod:`~hvdcompress.adam.variance`). The compressed allreduce re-sends a v-step's
reduced segment int4 in chunks of :data:`SERVER_INT4_CHUNK` = 64: that error lands on the mean
whole, where the ranks' is averaged over N, so it takes finer chunks (a min-max code's error is
(max-min)/30 of its chunk); the trade-off: the bounds (8 bytes per 32 of codes) add 1/4 to its bytes.

Adam's L2 weight decay λ·w is the same on every rank: added exactly after the exchange. As m is
the same on every rank, mean_r m_r = b1·m + (1-b1)·mean_r g_r: without compression both placements,
and both kinds of steps, are Adam (up to the rounding of u·x / u).
``clip_grad_norm`` (the wrappers'; :meth:`hvdcompress.step.driver.StepDriver.clips_before`): a v-step
clips the exchanged mean to c, as Horovod's pattern and dense AdamW do, and keeps its coefficient kappa
(:attr:`clip_scale`, checkpointed); a compressed step scales each rank's gradient by that kappa
before it is sent (then clips it to c·sqrt(N) against a spike), so that m sees the mean clipped
as v did at its last refresh (each rank clipped to c instead, m would see another clip than v).
Which to send: the gradient, not m. A sent m replaces every rank's, so one step's error stays
in m for 1/(1-b1) steps; with g sent, EF repays the error in the space it was made in.
``send="preconditioned"`` compresses each rank's g_r / (sqrt(v_hat) + eps) instead (0 where
v = 0), the gradient in update space, where the frozen-v step is linear; the exchanged mean is
multiplied back by sqrt(v_hat) + eps (uncompressed: the same Adam). Top-k's default: by magnitude
it then picks the coordinates whose step is largest, not those of large v, which Adam scales down.
Onebit gets a scale per row (``chunk="rows"``, unless chosen): with one per tensor a rare
token's embedding row gets ±s every step, which 1/sqrt(v) amplifies (:mod:`~hvdcompress.compressors.onebit`).
V-steps send the gradient only: a residual sent with them would enter g², and so v. Evidence:
benchmarks/README.md section 8. The wrappers replace the optimizer's step with :meth:`after_exchange`;
m, v and the unit live in the tensor's compressor state (``adam.m``, ``adam.v``, ``adam.unit``).
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

from ..compressors.int8 import Int4, Int8
from ..contract.compressor import Compressor, Packet, TensorInfo
from ..contract.memory import Decorator, check_inner
from ..contract.validation import check_int
from ..ops.facade import Ops, Tensor
from .settings import AdamSettings
from .variance import FIRST, LATE_WARMUP, LONG_FIRST, LONG_WARMUP, VarianceSchedule, long_warmup
from .variance import WARMUP as LIVE_STEPS

#: what each rank compresses after the freeze (the first: the default)
SEND = ("auto", "gradient", "momentum", "preconditioned")

#: what sends the gradient in a v-step (live Adam), FrozenAdam's ``warmup`` (the first: the default)
WARMUP = ("auto", "int8", "int4", "none")

#: tensors with fewer elements run live Adam at every step (FrozenAdam's ``min_numel``)
MIN_NUMEL = 0

#: steps after the first compressed step at which the lr must have moved (``delivers_late``; _check_decays)
DECAY_CHECK = 256

#: the chunk of the 4-bit codes that re-send a v-step's reduced segment (compressed allreduce)
SERVER_INT4_CHUNK = 64

class _Mild:
    """The ctx of a packet sent by a warm-up compressor in a v-step (decoded by it)."""

    def __init__(self, ctx: Any, compressor: Compressor):
        self.ctx, self.compressor = ctx, compressor


class _Phased(Decorator):
    """The server side of the compressed allreduce under FrozenAdam: in a v-step the summed
    segment is re-compressed by the (stateless) warm-up compressor, else by ``inner``'s."""

    def __init__(self, inner: Compressor, owner: "FrozenAdam"):
        super().__init__(inner)
        self.owner = owner

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        return self.owner._compress(self.inner, ops, x, state, info, server=True)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self.owner._decoder(self.inner, ctx).decompress(ops, tensors, _ctx(ctx), info, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        return self.owner._decoder(self.inner, ctx).decompress_gathered(ops, tensors, _ctx(ctx), info, world, out)


def _ctx(ctx: Any) -> Any:
    return ctx.ctx if isinstance(ctx, _Mild) else ctx


class FrozenAdam(Decorator):
    """1-bit-Adam-style take-over of Adam/AdamW around ``inner`` (see the module doc).

    ``inner``: any compressor that does not apply momentum itself (onebit, EF-signSGD, top-k,
    random-k, int8, the quantisers, PowerSGD; with ``ErrorFeedback`` where it keeps no residual
    of its own). ``freeze_steps``: None (default) for the variance schedule of
    :mod:`hvdcompress.adam.variance` (live Adam for 128 steps, then v refreshed at growing
    intervals), or T0: live Adam for T0 steps, then v frozen for good.
    ``send``: what each rank compresses in a compressed step, ``"gradient"``, ``"momentum"`` (1-bit
    Adam's placement), ``"preconditioned"``, or ``"auto"`` (default): preconditioned around top-k, else g.
    ``warmup``: what sends the gradient in a v-step (live Adam): ``"int8"``, ``"int4"`` (stateless
    min-max, :mod:`~hvdcompress.compressors.int8`), ``"none"`` (dense), or ``"auto"`` (default):
    dense where ``inner`` sends 16 bits or more, int4 in the long warm-up, else int8.
    ``live_steps``: W, the v-steps at the start (None: 512, the long warm-up, at b2 > 0.998 around
    top-k, PowerSGD and onebit from 4 ranks (:meth:`_follow`), else 256 where ``delivers_late``, 128).
    ``min_numel``: tensors with fewer elements run live Adam at every step (default
    :data:`MIN_NUMEL`). From strings: ``{"compressor": "onebit",
    "ef": "vanilla", "adam": "frozen", "freeze_steps": "100", "adam_send": "gradient", "adam_warmup":
    "int8", "adam_live_steps": "128", "adam_min_numel": "4096"}``.
    """

    takes_over_adam = True

    def __init__(self, inner: Compressor, freeze_steps: Optional[int] = None,
                 send: str = "auto", warmup: str = "auto", live_steps: Optional[int] = None,
                 min_numel: Optional[int] = None):
        check_inner(type(self), inner)
        algorithm = inner.unwrap().for_adam()   # a configured copy where it needs one
        super().__init__(inner if algorithm is inner.unwrap() else inner.with_algorithm(algorithm))
        needs = algorithm.adam_needs
        if send not in SEND:
            raise ValueError(f"FrozenAdam: send={send!r}; allowed: {', '.join(map(repr, SEND))}")
        if warmup not in WARMUP:
            raise ValueError(f"FrozenAdam: warmup={warmup!r}; allowed: {', '.join(map(repr, WARMUP))}")
        # auto: top-k picks its k by magnitude, which must be the step's (Adam's update space)
        self.send = send if send != "auto" else "preconditioned" if needs.selects_by_magnitude else "gradient"
        if inner.takes_over_momentum:
            raise ValueError(f"FrozenAdam({inner!r}): {inner.name} applies momentum itself (SGD's "
                             "momentum correction); FrozenAdam needs a compressor without it "
                             "(onebit, efsignsgd, topk, randomk, int8, the quantisers, powersgd)")
        self.freeze_steps = None if freeze_steps is None else check_int(
            "FrozenAdam", "freeze_steps", freeze_steps, 0)
        self.live_steps = None if live_steps is None else check_int("FrozenAdam", "live_steps", live_steps, 1)
        # W; the first step's b2 may lengthen it (_follow)
        self._short = LATE_WARMUP if needs.delivers_late else LIVE_STEPS
        self.schedule = VarianceSchedule(self.freeze_steps, self.live_steps or self._short)
        self.warmup = warmup
        self.mild: Optional[Compressor] = (None if warmup == "none" or (warmup == "auto" and needs.wide)
                                           else Int4() if warmup == "int4" else Int8())
        self._server_int4 = Int4(chunk=SERVER_INT4_CHUNK)   # stateless: one for every v-step
        self.min_numel = MIN_NUMEL if min_numel is None else check_int("FrozenAdam", "min_numel", min_numel, 0)
        self.steps = 0
        self.beta2: Optional[float] = None   # the b2 of the schedule's intervals (the first step's, smallest)
        self.world: Optional[int] = None     # the ranks of the exchange (set_world; None: unknown, taken as 1)
        self.clip_scale = 1.0   # kappa: the clip coefficient of the exchanged mean at the last v-step
        self.lr_unit: Optional[float] = None   # L: the lr of the first compressed step (_unit)
        self._lr_checked = False               # whether the lr was checked for decay (_check_decays)
        self._server: Optional[_Phased] = None

    @property
    def carries_state(self) -> bool:  # type: ignore[override]
        return True

    def server_side(self) -> Compressor:
        """The momentum is each rank's; the sum is re-compressed by the inner compressor's server
        side, or by the warm-up compressor in a v-step."""
        inner = self.inner.server_side()
        if self._server is None or self._server.inner is not inner:
            self._server = _Phased(inner, self)
        return self._server

    def _phase_b2(self, settings: Optional[AdamSettings]) -> float:
        """The b2 that sets the schedule's intervals: the smallest of the param groups' at the
        first step, kept (and checkpointed) after it, so that every tensor and rank agree."""
        if settings is not None and (self.beta2 is None or (self.steps == 0 and settings.beta2 < self.beta2)):
            self.beta2 = settings.beta2
            self._follow(self.beta2)
        return 0.999 if self.beta2 is None else self.beta2

    def set_world(self, world: int) -> None:
        """The number of ranks the exchange spans (the step driver's, at each engine it builds):
        onebit's warm-up follows it (:meth:`_follow`)."""
        self.world = check_int("FrozenAdam", "world", world, 1)
        if self.beta2 is not None:
            self._follow(self.beta2)

    def _follow(self, beta2: float) -> None:
        """Around an algorithm whose ``adam_needs.long_warmup_ranks`` this world reaches (no freeze_steps or
        live_steps), where 1/(1-b2) > 512: 512 live steps sent int4 (``warmup="auto"``), then the
        first interval :data:`LONG_FIRST` (FIRST where ``delivers_late``; :mod:`~hvdcompress.adam.variance`)."""
        needs = self.inner.unwrap().adam_needs
        follows = needs.long_warmup_ranks is not None and (self.world or 1) >= needs.long_warmup_ranks
        if self.live_steps is None and self.freeze_steps is None:   # else the user's W
            long = follows and long_warmup(beta2, self._short) == LONG_WARMUP
            self.schedule.warmup = LONG_WARMUP if long else self._short
            self.schedule.first = FIRST if needs.delivers_late or not long else LONG_FIRST
            if self.warmup == "auto" and self.mild is not None:
                self.mild = Int4() if long else Int8()

    def live(self, numel: Optional[int]) -> bool:
        """Whether a tensor of ``numel`` elements runs live Adam at every step (``min_numel``)."""
        return numel is not None and numel < self.min_numel

    def frozen(self, settings: Optional[AdamSettings] = None, numel: Optional[int] = None) -> bool:
        """Whether this step (the ``steps + 1``-th) is a compressed step (v kept), not a v-step
        (:mod:`hvdcompress.adam.variance`; the same for every param group), for a tensor of
        ``numel`` elements (None: a large one)."""
        return not self.live(numel) and not self.schedule.updates(self.steps + 1, self._phase_b2(settings))

    def sends_dense(self, settings: Optional[AdamSettings] = None, numel: Optional[int] = None) -> bool:
        """Whether this step's tensor of ``numel`` elements goes as it is (allreduce): live Adam
        with warmup none."""
        return self.mild is None and not self.frozen(settings, numel)

    def sends_mild(self, settings: Optional[AdamSettings] = None, numel: Optional[int] = None) -> bool:
        """Whether this step's tensor of ``numel`` elements is sent by the warm-up compressor
        (:attr:`TensorInfo.mild <hvdcompress.contract.compressor.TensorInfo>`): live Adam with warmup int8."""
        return self.mild is not None and not self.frozen(settings, numel)

    def _compress(self, inner: Compressor, ops: Ops, x: Tensor, state: dict, info: TensorInfo,
                  server: bool = False) -> Packet:
        if self.mild is None or (self.frozen() and not info.mild):
            return inner.compress(ops, x, state, info)
        mild = self._server_mild() if server else self.mild
        packet = mild.compress(ops, x, {}, info)   # stateless: inner's residual untouched
        return Packet(packet.tensors, _Mild(packet.ctx, mild), packet.summable, packet.resume)

    def _server_mild(self) -> Compressor:
        """What re-sends a v-step's reduced segment in the compressed allreduce: the warm-up
        compressor, with 4-bit codes in chunks of :data:`SERVER_INT4_CHUNK` (module doc)."""
        return self._server_int4 if isinstance(self.mild, Int4) else self.mild

    def _decoder(self, inner: Compressor, ctx: Any) -> Compressor:
        return ctx.compressor if isinstance(ctx, _Mild) else inner

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        return self._compress(self.inner, ops, x, state, info)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self._decoder(self.inner, ctx).decompress(ops, tensors, _ctx(ctx), info, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        return self._decoder(self.inner, ctx).decompress_gathered(ops, tensors, _ctx(ctx), info, world, out)

    # ---- the wrapper's side ---------------------------------------------------------------
    def before_exchange(self, ops: Ops, x: Tensor, state: dict, settings: AdamSettings,
                        param: Tensor) -> Tensor:
        """What this rank exchanges for the local gradient ``x`` (flat): ``x`` in a v-step; in a
        compressed step its gradient, its momentum b1·m + (1-b1)·x (``send="momentum"``) or its
        preconditioned gradient, times u = lr / L (:meth:`_unit`). ``state`` is the whole tensor's (m, v
        and the unit are created there on first use), not a segment's or a shard's."""
        for key in ("adam.m", "adam.v"):
            if key not in state:
                ops.write(state, key, ops.zeros(ops.numel(x), like=x))
        if "adam.unit" not in state:
            ops.write(state, "adam.unit", ops.zeros(1, like=x) + 1.0)
        if not self.frozen(settings, ops.numel(x)):
            return x
        if settings.lr > 0.0:   # the run's lr unit L: the first compressed step's lr (the same on every rank)
            self.lr_unit = self.lr_unit or settings.lr
            self._check_decays(settings.lr)
            ops.write(state, "adam.unit", state["adam.unit"] * 0.0 + settings.lr / self.lr_unit)
        unit = self._unit(state, settings)
        if self.send == "gradient":
            return x * unit
        if self.send == "preconditioned":   # coordinates with v = 0 send 0 (not updated)
            v = state["adam.v"]
            return ops.where(v > 0.0, x / self._denominator(ops, state, settings) * unit,
                             ops.zeros(ops.numel(x), like=x))
        return (state["adam.m"] * settings.beta1 + x * (1.0 - settings.beta1)) * unit

    def _check_decays(self, lr: float) -> None:
        """Around a compressor that ``delivers_late`` (top-k, random-k), a ``UserWarning`` once if the
        lr :data:`DECAY_CHECK` steps after the first compressed step (after W or T0 v-steps) is still
        that step's: top-k's gap opens at the switch to compressed steps and a decaying lr closes it
        by the run's end, a constant one keeps it (docs/adam.md)."""
        first = (self.schedule.warmup if self.freeze_steps is None else self.freeze_steps) + 1
        if not self._lr_checked and self.steps + 1 >= first + DECAY_CHECK:
            self._lr_checked = True
            if lr == self.lr_unit and self.inner.unwrap().adam_needs.delivers_late:
                warnings.warn(f"FrozenAdam around {type(self.inner.unwrap()).__name__}: the learning rate has "
                              f"stayed {lr!r} since the first compressed step; with a sparsifier (top-k, random-k) "
                              "+ error feedback the take-over converges under a decaying learning rate, not a "
                              "constant one: decay it, or use onebit or PowerSGD (docs/adam.md)",
                              UserWarning, stacklevel=2)

    def _unit(self, state: dict, settings: AdamSettings) -> Any:
        """What a compressed step's exchange is multiplied by: lr / L, L the run's first compressed
        lr (:attr:`lr_unit`), so that the error-feedback residual holds a displacement (EF-SGD's
        p = lr·g + e; 0/1 Adam compresses lr-weighted updates) and mass that waits is applied at
        the lr it was computed with, not a later, smaller one (cosine halves lr by mid-run); 1.0
        at a constant lr. At lr 0 (nothing moves) the tensor's last (``adam.unit``, 1.0 before any)."""
        return settings.lr / self.lr_unit if settings.lr > 0.0 and self.lr_unit else state.get("adam.unit", 1.0)

    def _denominator(self, ops: Ops, state: dict, settings: AdamSettings, live: bool = False) -> Tensor:
        """sqrt(v / (1 - decay)) + eps: Adam's per-coordinate scale, v's bias correction over the
        v-steps so far (1 - b2^min(t, T0) with freeze_steps, Adam's 1 - b2^t for a ``live`` tensor)."""
        t = self.steps + 1
        decay = settings.beta2 ** t if live else self.schedule.decay(t, settings.beta2, self._phase_b2(settings))
        return ops.sqrt(state["adam.v"] * (1.0 / (1.0 - decay))) + settings.eps

    def after_exchange(self, ops: Ops, state: dict, param: Tensor, exchanged: Tensor,
                       settings: AdamSettings) -> Tensor:
        """The new value of ``param`` (flat) from the exchanged mean (the gradient in a v-step,
        what :attr:`send` names in a compressed step); updates m (and v in a v-step). Adam's L2
        weight decay λ·w is the same on every rank, so it is added here, exactly, not sent."""
        b1, b2 = settings.beta1, settings.beta2
        t = self.steps + 1
        l2 = settings.weight_decay if not settings.decoupled else 0.0
        numel = ops.numel(param)
        live, frozen = self.live(numel), self.frozen(settings, numel)
        if frozen:   # back from lr units
            unit = self._unit(state, settings)
            exchanged = exchanged * (1.0 / unit) if isinstance(unit, float) else exchanged / unit
        if frozen and self.send == "momentum":
            ops.write(state, "adam.m", exchanged + param * ((1.0 - b1) * l2) if l2 else exchanged * 1.0)
        else:
            if frozen and self.send == "preconditioned":   # back from update space
                exchanged = exchanged * self._denominator(ops, state, settings)
            g = exchanged + param * l2 if l2 else exchanged
            ops.write(state, "adam.m", state["adam.m"] * b1 + g * (1.0 - b1))
            if not frozen:
                keep, alpha = (b2, 1.0 - b2) if live else self.schedule.weights(t, b2, self._phase_b2(settings))
                ops.write(state, "adam.v", state["adam.v"] * keep + g * g * alpha)
        denom = self._denominator(ops, state, settings, live)
        update = state["adam.m"] * (1.0 / (1.0 - b1 ** t)) / denom
        if frozen:  # coordinates without a gradient in any v-step so far (v = 0) stay where they are
            update = ops.where(state["adam.v"] > 0.0, update, ops.zeros(ops.numel(update), like=update))
        if settings.decoupled and settings.weight_decay:
            param = param * (1.0 - settings.lr * settings.weight_decay)
        return param - update * settings.lr

    # ---- compressor-wide state ----------------------------------------------------------------
    def on_step(self) -> None:
        self.steps += 1
        super().on_step()

    def state_dict(self) -> dict:
        return {**self.inner.state_dict(), "adam_steps": self.steps,   # the same keys from the start (TF)
                "adam_beta2": 0.0 if self.beta2 is None else self.beta2,   # 0.0: not set yet
                "adam_clip_scale": self.clip_scale, "adam_lr_unit": self.lr_unit or 0.0}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.steps = int(state.pop("adam_steps", 0))
        beta2 = float(state.pop("adam_beta2", 0.0))
        self.beta2 = beta2 if beta2 > 0.0 else None
        if self.beta2 is not None:
            self._follow(self.beta2)
        self.clip_scale = float(state.pop("adam_clip_scale", 1.0))
        self.lr_unit = float(state.pop("adam_lr_unit", 0.0)) or None   # none before: the residual is in L's units
        self.inner.load_state_dict(state)

    def arguments(self) -> dict:
        return {"adam": "frozen", "freeze_steps": self.freeze_steps, "adam_send": self.send,
                "adam_warmup": self.warmup, "adam_live_steps": self.live_steps, "adam_min_numel": self.min_numel}
