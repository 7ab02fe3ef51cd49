"""The Adam take-over: compression that converges with Adam and AdamW (1-bit Adam style).

Adam divides each coordinate by its running RMS, sqrt(v). Compressing the gradient next to a
live v fails twice: the compression error of quiet coordinates is amplified by 1/sqrt(v), and
error feedback delivers its delayed mass into a preconditioner that has moved on meanwhile.
1-bit Adam (Tang et al., ICML 2021) observed that v stabilises early, so after a warm-up it
can be frozen; Adam is then a momentum method with a fixed per-coordinate scale, linear in the
exchanged quantity, and error feedback works again. What :class:`FrozenAdam` runs, per tensor,
with b1, b2, eps, lr, weight decay λ read from the optimizer's param group at every step:

warm-up, steps t <= T0 (full precision, exactly Adam on the averaged gradient)::

    every rank sends its gradient g_r dense (allreduce);  g = mean_r g_r
    m <- b1·m + (1-b1)·g;   v <- b2·v + (1-b2)·g²

after the freeze, t > T0 (v kept as it was at T0), ``send="gradient"`` (the default): each
rank's gradient is compressed by the wrapped compressor (with its error feedback: the residual
lives in gradient space) and the momentum is formed from the exchanged mean, as in the warm-up::

    g = mean_r D(C(g_r))              the exchange (allgather, compressed allreduce, two-level...)
    m <- b1·m + (1-b1)·g

or, with ``send="momentum"`` (1-bit Adam's placement), each rank's own momentum is compressed
(the residual lives in m-space)::

    m_r = b1·m + (1-b1)·g_r;   m <- mean_r D(C(m_r))

then in both phases, as torch.optim.Adam/AdamW (bias corrections with v's at T0 once frozen)::

    w <- w·(1 - lr·λ)  (AdamW);   w <- w - lr · (m / (1-b1^t)) / (sqrt(v / (1-b2^min(t,T0))) + eps)

except that after the freeze a coordinate whose frozen v is 0 (it had no gradient in the whole
warm-up: an unused embedding row, an always-zero input pixel) is not updated. Its denominator is
eps, so the compression error the exchange gives it (onebit sends ±scale for a zero gradient)
would move it by lr·scale/eps, about 1e8 steps at once: training went to NaN on digits. Live
Adam would have grown v with its first real gradient; frozen, no safe step exists, and none is
taken (DeepSpeed's 1-bit Adam asks the user for such a mask, ``exp_avg_mask``; here it is v = 0).

Adam's own (L2) weight decay adds λ·w to the exchanged gradient (to m, times 1-b1, after the
freeze): it is the same on every rank, so it is added exactly instead of being compressed.
Since m is the same on every rank, mean_r m_r = b1·m + (1-b1)·mean_r g_r: without compression
both placements, and both phases, are Adam.

``clip_grad_norm`` (the wrappers'): during the warm-up the exchanged mean is the gradient, so
the torch optimizer clips it after the exchange, as Horovod's pattern does; after the freeze
each rank clips its own gradient to c before compression (:func:`hvdcompress.clipping.local_clip_limit`),
which keeps the exchanged mean within c, as in the warm-up. The c·sqrt(N) of the other
stateful compressors lets the mean reach sqrt(N)·c when the ranks agree, which the frozen v
passes through unscaled: at 8 ranks (LSTM, seed 1) that rule measured +0.075 (frozen at 250; the
loss jumped from 2.91 to 3.24 bits/byte after the freeze) and +0.035 (frozen at 750, 2,000 steps),
clipping to c +0.053 (jump to 3.11) and +0.021.
The TF wrappers clip locally throughout (the choice is made when the graph is traced).

Which to send: measured on two byte-level language models (benchmarks/README.md section 8),
sending the gradient is as good or better for every compressor: with the momentum sent, the
exchanged m replaces every rank's m, so the compression error of one step stays in m and is
then amplified by 1/sqrt(v) for 1/(1-b1) steps, and a sparsifier's unsent coordinates see
their momentum decay by b1 each step while the residual holds their mass; with the gradient
sent, the error goes through m's low-pass once, and error feedback repays it in the space it
was made in (top-k: +0.091 -> +0.027, PowerSGD +0.068 -> -0.002 on the LSTM).

``send="preconditioned"`` compresses each rank's g_r / (sqrt(v_hat) + eps) instead (0 where
v = 0), the gradient in update space, where Adam's step is linear once v is frozen: a quantiser's
one scale then fits every coordinate alike, and error feedback repays in the space the step is
taken in; the exchanged mean is multiplied back by sqrt(v_hat) + eps. Uncompressed it is the same
Adam. Measured at 8 ranks (LSTM, onebit frozen at 250, seed 1): +0.070 against the gradient's
+0.075, within the run's noise; the jump of the loss at the freeze stays. Kept as an ablation of
where error feedback sits (gradient, momentum or update space), not the default.

The trade-off: T0 steps at full precision (dense bytes), then the wrapped compressor's bytes;
too early a freeze keeps a v estimated from few gradients. The default T0 is
``ceil(q / (1 - b2))``, when v's moving average spans the share q of its time constant (1-bit
Adam warmed up for 15-25% of BERT's training), the coarser the compressor's per-step error, the
later:

* q = 1/4 (250 steps for b2 = 0.999): int8 and the quantisers, whose error per coordinate is
  small and unbiased or repaid the next step;
* q = 3/4 (750): the 1-bit family (onebit, EF-signSGD), one bit per coordinate, the
  sparsifiers (top-k, random-k, threshold), whose error feedback delivers a coordinate's mass
  after many steps at once through the frozen 1/sqrt(v), and PowerSGD, whose rank-r
  approximation drops whole directions for as long: v must be estimated better. (Half,
  500 steps, served top-k at 2 ranks; at 8 ranks it jumped at the freeze on the transformer,
  +0.074 against +0.004 at 750, and random-k missed at 2 ranks already. PowerSGD at 250 did
  best at 2 ranks, -0.017 / -0.024, but jumped at 8 ranks on the transformer, +0.107 against
  +0.005 at 750.)

Measured (benchmarks/README.md section 8, gap to dense AdamW): top-k 1% on the transformer
+0.066 frozen at 250, +0.048 / +0.049 (two seeds) at 500; on the LSTM +0.027 -> +0.011. Onebit
at 8 ranks: on the LSTM +0.011 / +0.080 (two seeds) at 250, +0.001 / +0.003 at 750; on a second,
untuned LSTM task +0.043 at 250, +0.008 at 750 (1,000-step runs: 250 compressed steps); over
2,000 steps (1,250 compressed) +0.035 at 750 with the old c·sqrt(N) clip, +0.021 / +0.023 (two seeds) with the
clip to c. Random-k 1% on the LSTM at 2 ranks: +0.108 / +0.226 (two seeds) at 500, +0.005 / +0.013 at 750. PowerSGD
at 2 ranks did better frozen early (-0.002 / -0.017 at 250 against +0.004 / +0.005 at 500), but not at 8. At today's
defaults every compressor is within its target on both models at 2 and 8 ranks wherever it was run
(``benchmarks/adamw_summary.py``: 0.000-0.020 above dense AdamW).

The wrapper (torch optimizer) replaces the wrapped optimizer's step with :meth:`after_exchange`;
the user's param groups, schedulers and checkpoints keep their values; m and v live in the
tensor's compressor state (``adam.m``, ``adam.v``, in the optimizer's ``state_dict()``), the step
count in the compressor's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .adam_freeze import VarianceSchedule
from .backend import Ops, Tensor
from .compressor import Compressor, Packet, TensorInfo
from .compressors.cast import Cast
from .compressors.int8 import Int8
from .compressors.none import NoCompression
from .memory import Decorator
from .validation import check_int

#: what each rank compresses after the freeze (the first: the default)
SEND = ("gradient", "momentum", "preconditioned")

#: what sends the gradient in a v-step (live Adam), FrozenAdam's ``warmup`` (the first: the default)
WARMUP = ("auto", "int8", "none")

#: the param-group keys of torch.optim.Adam/AdamW that the take-over refuses when set
UNSUPPORTED = {"amsgrad": False, "maximize": False}


@dataclass
class AdamSettings:
    """One param group's Adam hyper-parameters, read at every step."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float = 0.0
    decoupled: bool = False   # AdamW: w <- w·(1 - lr·λ); Adam: λ·w added to the gradient


def adam_settings(group: Mapping[str, Any], index: int = 0) -> AdamSettings:
    """:class:`AdamSettings` from a torch.optim.Adam/AdamW param group; ValueError naming the
    option for what the take-over does not run (amsgrad, maximize)."""
    for key, default in UNSUPPORTED.items():
        if group.get(key, default) != default:
            raise ValueError(f"param_groups[{index}] {key}={group[key]!r}: FrozenAdam runs Adam "
                             f"and AdamW with {key}={default!r} only")
    beta1, beta2 = (float(b) for b in group["betas"])
    return AdamSettings(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                        weight_decay=float(group.get("weight_decay", 0.0)),
                        decoupled=bool(group.get("decoupled_weight_decay", False)))


class _Mild:
    """The ctx of a packet sent by the warm-up compressor in a v-step (decoded by it)."""

    def __init__(self, ctx: Any):
        self.ctx = ctx


class _Phased(Decorator):
    """The server side of the compressed allreduce under FrozenAdam: in a v-step the summed
    segment is re-compressed by the (stateless) warm-up compressor, else by ``inner``'s."""

    def __init__(self, inner: Compressor, owner: "FrozenAdam"):
        super().__init__(inner)
        self.owner = owner

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        return self.owner._compress(self.inner, ops, x, state, info)

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
    :mod:`hvdcompress.adam_freeze` (live Adam for 32 steps, then v refreshed at growing
    intervals), or T0: live Adam for T0 steps, then v frozen for good.
    ``send``: what each rank compresses in a compressed step, ``"gradient"`` (default),
    ``"momentum"`` (1-bit Adam's placement) or ``"preconditioned"``.
    ``warmup``: what sends the gradient in a v-step (live Adam): ``"int8"`` (:class:`Int8`,
    stateless), ``"none"`` (dense allreduce), or ``"auto"`` (default): int8, dense where
    ``inner`` sends 16 bits or more per element (none, fp16, bf16). From strings:
    ``{"compressor": "onebit", "ef": "vanilla", "adam": "frozen", "freeze_steps": "100",
    "adam_send": "gradient", "adam_warmup": "int8"}``.
    """

    takes_over_adam = True

    def __init__(self, inner: Compressor, freeze_steps: Optional[int] = None,
                 send: str = "gradient", warmup: str = "auto"):
        super().__init__(inner)
        if send not in SEND:
            raise ValueError(f"FrozenAdam: send={send!r}; allowed: {', '.join(map(repr, SEND))}")
        if warmup not in WARMUP:
            raise ValueError(f"FrozenAdam: warmup={warmup!r}; allowed: {', '.join(map(repr, WARMUP))}")
        self.send = send
        if inner.takes_over_momentum:
            raise ValueError(f"FrozenAdam({inner!r}): {inner.name} applies momentum itself (SGD's "
                             "momentum correction); FrozenAdam needs a compressor without it "
                             "(onebit, efsignsgd, topk, randomk, int8, the quantisers, powersgd)")
        self.freeze_steps = None if freeze_steps is None else check_int(
            "FrozenAdam", "freeze_steps", freeze_steps, 0)
        self.schedule = VarianceSchedule(self.freeze_steps)
        self.warmup = warmup
        wide = isinstance(inner.unwrap(), (NoCompression, Cast))
        self.mild: Optional[Compressor] = None if warmup == "none" or (warmup == "auto" and wide) else Int8()
        self.steps = 0
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

    def frozen(self, settings: Optional[AdamSettings] = None) -> bool:
        """Whether this step (the ``steps + 1``-th) is a compressed step (v kept), not a v-step
        (:mod:`hvdcompress.adam_freeze`; the same for every param group)."""
        return not self.schedule.updates(self.steps + 1)

    def warming_up(self, groups: Sequence[AdamSettings]) -> bool:
        """Whether this step is a v-step (live Adam on the exchanged mean) for every param group:
        the exchanged mean is then the gradient (dense, or int8's stateless decoding), so
        ``clip_grad_norm`` clips it after the exchange as Horovod does (the local clip of
        stateful compressors, c·sqrt(N) on each rank, cost +0.02 bits/byte on the language
        model, benchmarks/README.md section 8)."""
        return not any(self.frozen(s) for s in groups)

    def sends_dense(self, settings: Optional[AdamSettings] = None) -> bool:
        """Whether this step's tensors go as they are (allreduce): a v-step with warmup none."""
        return self.mild is None and not self.frozen(settings)

    def _compress(self, inner: Compressor, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        if self.mild is None or self.frozen():
            return inner.compress(ops, x, state, info)
        packet = self.mild.compress(ops, x, {}, info)   # stateless: inner's residual untouched
        return Packet(packet.tensors, _Mild(packet.ctx), packet.summable, packet.resume)

    def _decoder(self, inner: Compressor, ctx: Any) -> Compressor:
        return self.mild if isinstance(ctx, _Mild) else inner

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
        """What this rank exchanges for the local gradient ``x`` (flat): ``x``, except in a
        compressed step with ``send="momentum"`` (its momentum b1·m + (1-b1)·x) or
        ``"preconditioned"``. ``state`` is the whole tensor's (m and v are created there on
        first use), not a segment's or a shard's."""
        for key in ("adam.m", "adam.v"):
            if key not in state:
                ops.write(state, key, ops.zeros(ops.numel(x), like=x))
        if not self.frozen(settings) or self.send == "gradient":
            return x
        if self.send == "preconditioned":   # coordinates with v = 0 send 0 (not updated)
            v = state["adam.v"]
            return ops.where(v > 0.0, x / self._denominator(ops, state, settings),
                             ops.zeros(ops.numel(x), like=x))
        return state["adam.m"] * settings.beta1 + x * (1.0 - settings.beta1)

    def _denominator(self, ops: Ops, state: dict, settings: AdamSettings) -> Tensor:
        """sqrt(v / (1 - decay)) + eps: Adam's per-coordinate scale, v's bias correction over the
        v-steps so far (1 - b2^min(t, T0) with freeze_steps)."""
        decay = self.schedule.decay(self.steps + 1, settings.beta2)
        return ops.sqrt(state["adam.v"] * (1.0 / (1.0 - decay))) + settings.eps

    def after_exchange(self, ops: Ops, state: dict, param: Tensor, exchanged: Tensor,
                       settings: AdamSettings) -> Tensor:
        """The new value of ``param`` (flat) from the exchanged mean (the gradient in a v-step,
        what :attr:`send` names in a compressed step); updates m (and v in a v-step). Adam's L2
        weight decay λ·w is the same on every rank, so it is added here, exactly, not sent."""
        b1, b2 = settings.beta1, settings.beta2
        t = self.steps + 1
        l2 = settings.weight_decay if not settings.decoupled else 0.0
        frozen = self.frozen(settings)
        if frozen and self.send == "momentum":
            ops.write(state, "adam.m", exchanged + param * ((1.0 - b1) * l2) if l2 else exchanged * 1.0)
        else:
            if frozen and self.send == "preconditioned":   # back from update space
                exchanged = exchanged * self._denominator(ops, state, settings)
            g = exchanged + param * l2 if l2 else exchanged
            ops.write(state, "adam.m", state["adam.m"] * b1 + g * (1.0 - b1))
            if not frozen:
                keep, alpha = self.schedule.weights(t, b2)
                ops.write(state, "adam.v", state["adam.v"] * keep + g * g * alpha)
        denom = self._denominator(ops, state, settings)
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
        return {**self.inner.state_dict(), "adam_steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.steps = int(state.pop("adam_steps", 0))
        self.inner.load_state_dict(state)

    def config(self) -> dict:
        return {"adam": "frozen", "freeze_steps": self.freeze_steps, "adam_send": self.send,
                "adam_warmup": self.warmup, **self.inner.config()}
