"""Deep Gradient Compression (Lin et al., ICLR 2018).

Per tensor and step, with local gradient ``g``, momentum ``m``, weight decay ``λ``, ``N`` ranks::

    g ← g + λ·w                                  weight-decay correction (λ moved out of the optimizer)
    g ← g · min(1, c / (√N · ‖g‖))               local gradient clipping (when clip_norm=c is set)
    u ← m·u + g;        v ← v + u                momentum correction (plain)
    u ← m·(u + g);      v ← v + u + g            momentum correction (Nesterov)
    I ← {i : |v_i| ≥ θ}                          θ from a strided sample of |v| (below)
    send (v_I, I);      v_I ← 0;  u_I ← 0        factor masking of u (masking=True)
                        u_i ← 0 for i ∈ I, u_i non-finite    (masking=False)

Masking off (the default) keeps the momentum of what was sent, as momentum SGD does (exactly
so at sparsity 0). The paper masks it so that a coordinate just sent is not pushed on by the
momentum of steps already applied; the price is that its velocity restarts from zero after
every send, which slows the coordinates sent most often. Evidence: benchmarks/README.md
section 6 (Language model with SGD and clipping), "Why the defaults". A non-finite momentum entry
(from a NaN/Inf gradient, e.g. a mixed-precision overflow step) is sent and then cleared, with
or without masking, so that one bad step is not sent again at every later step; small tensors
sent dense clear theirs too.

The sum over ranks of the sent values, divided by N, is applied by the wrapped optimizer as a
plain SGD step, which is why DGC takes the optimizer's momentum over (``takes_over_momentum``).
At sparsity 0 with masking off this is exactly momentum SGD on the averaged gradient.

Threshold: ``k = ⌈n·(1−s)⌉``. The top ``⌈(1−s)·S⌉`` of ``S`` samples of |v| taken at an odd
stride from a pseudo-random start give θ; when the count selected is off by more than
``upper``/``lower`` the threshold is scaled and the count taken again (at most
``max_adaptation_iters`` times); far too many is cut to the exact top-k among the candidates
(``resample``). Tensors of at most ``⌈2/(1−s)⌉`` elements use all elements as the sample (exact).
The trade-off: one pass over the sample instead of a full sort, at the price of sending between
``lower·k`` and ``k`` elements.

Tensors with fewer than ``min_numel`` elements (biases, norms), and every tensor while the
current sparsity is 0, are sent dense (``u`` plus any velocity) through allreduce.

Sparsity warm-up: ``warmup`` is an :class:`~hvdcompress.contract.schedule.ExponentialWarmup` or
:class:`~hvdcompress.contract.schedule.ListWarmup`, counted in epochs (:meth:`set_epoch`) or optimizer
steps (:meth:`on_step`).

Everything but the selection lives in :class:`MomentumCorrection`, which CSC
(:mod:`hvdcompress.compressors.csc`) shares. On the C++ kernels (CPU tensors, PyTorch and
TensorFlow) DGC runs momentum correction, threshold, selection and release as one pass over the
data (:meth:`DGC.fused_select`, kernels.h ``dgc_select``), with the same results bit for bit;
other paths (Triton, plain torch) take them one operation at a time.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from ..contract.compressor import Packet, TensorInfo, check_float_tensor
from ..contract.keys import step_key
from ..contract.schedule import Schedule, SparsityWarmup
from ..contract.validation import check_bool, check_int, check_range
from ..ops.facade import Ops, Scalar, Tensor
from .density import resolve_k
from .sparse import SparseCompressor

#: Whether DGC takes the fused momentum correction and selection of the C++ kernels
#: (``Ops.dgc_select``) where it applies; False: the same results, one operation at a time.
FUSED = True


class MomentumCorrection(SparsityWarmup, SparseCompressor):
    """DGC's machinery around the selection, shared by DGC and CSC: weight-decay correction,
    local clipping, momentum correction with the velocity as residual, factor masking, sparsity
    warm-up, small tensors and zero sparsity dense (the module doc gives the maths). Subclasses
    give :attr:`target_sparsity` and choose what to send from the velocity ``v``."""

    takes_over_momentum = True

    def __init__(self, owner: str, momentum: Optional[float], nesterov: Optional[bool],
                 masking: bool, clip_norm: Optional[float], weight_decay: Optional[float],
                 min_numel: int, warmup: Optional[Schedule]):
        self.momentum = None if momentum is None else check_range(owner, "momentum", momentum, 0.0, 1.0, high_open=True)
        self.nesterov = check_bool(owner, "nesterov", nesterov, none=True)
        self.masking = check_bool(owner, "masking", masking)
        self.clip_norm = None if clip_norm is None else check_range(owner, "clip_norm", clip_norm, 0.0, math.inf, low_open=True)
        self.weight_decay = None if weight_decay is None else check_range(owner, "weight_decay", weight_decay, 0.0, math.inf)
        self.min_numel = check_int(owner, "min_numel", min_numel, 0)
        self.init_warmup(owner, warmup)

    @property
    def explicit_momentum(self) -> Optional[float]:
        return self.momentum

    # ---- the shared steps ----------------------------------------------------------------------
    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        for key in ("momentum", "velocity"):
            if key not in state:
                ops.write(state, key, ops.zeros(info.numel, like=x))

    def correct(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Union[Packet, tuple]:
        """Weight decay, clipping and momentum correction of the gradient ``x``: a dense packet
        (small tensor or sparsity 0; the velocity is flushed), else ``(u, v)``, the new momentum
        and velocity, which :meth:`release` stores in ``state`` (on an in-place backend they are
        its buffers already; else fresh tensors that only the caller holds)."""
        prepared = self.prepare(ops, x, state, info)
        if isinstance(prepared, Packet):
            return prepared
        g, mu, nesterov = prepared
        return ops.momentum_correction(state["momentum"], state["velocity"], g, mu, nesterov)

    def prepare(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Union[Packet, tuple]:
        """:meth:`correct` up to the momentum correction: the dense packet, or ``(g, mu,
        nesterov)``, the gradient after weight decay and clipping and the momentum to apply."""
        check_float_tensor(ops, x, info)
        g = x
        wd = info.weight_decay if self.weight_decay is None else self.weight_decay
        if wd and info.param is not None:
            g = g + info.param * wd
        if self.clip_norm is not None:
            limit = self.clip_norm / math.sqrt(info.world)
            norm = ops.cast(ops.norm(g), "float64")  # min(1, limit / (‖g‖ + 1e-6)) in float64, on the device
            factor = (ops.reshape(ops.zeros(1, like=norm), ()) + limit) / (norm + 1e-6)
            g = g * ops.cast(ops.choose(factor < 1.0, factor, 1.0), ops.dtype(g))
        mu = info.momentum if self.momentum is None else self.momentum
        nesterov = info.nesterov if self.nesterov is None else self.nesterov
        if info.numel < self.min_numel or self.current_sparsity == 0.0:  # dense: a new tensor for the collective
            if nesterov:
                u = ops.accumulate(state, "momentum", 1.0, g, post=mu)
            else:
                u = ops.accumulate(state, "momentum", mu, g)
            v = state["velocity"] + u + g if nesterov else state["velocity"] + u
            ops.write(state, "velocity", ops.zeros(info.numel, like=x))
            ops.write(state, "momentum", ops.zero_non_finite(u))
            return Packet([v], None, summable=True)
        return g, mu, nesterov

    def release(self, ops: Ops, state: dict, u: Tensor, v: Tensor, indices: Tensor) -> None:
        """The elements at ``indices`` were sent: clear them from the velocity and, with
        masking, from the momentum; without masking, clear only the non-finite ones there (O(k),
        no host read). Then store both. ``u`` and ``v`` are :meth:`correct`'s, not stored nor
        handed out yet: filled in place even where tensors are immutable."""
        ops.write(state, "velocity", ops.fill_at(v, indices, 0.0, owned=True))
        ops.write(state, "momentum", ops.fill_at(u, indices, 0.0, non_finite_only=not self.masking,
                                                 owned=True))


class DGC(MomentumCorrection):
    """Deep Gradient Compression. ``sparsity`` is the fraction of elements *not* sent."""

    name = "dgc"

    def __init__(self, sparsity: float = 0.999, momentum: Optional[float] = None,
                 nesterov: Optional[bool] = None, masking: bool = False,
                 clip_norm: Optional[float] = None, weight_decay: Optional[float] = None,
                 min_numel: int = 16384, sample_ratio: float = 0.01, upper: float = 1.3,
                 lower: float = 0.8, max_adaptation_iters: int = 10, resample: bool = True,
                 fp16_values: bool = False, warmup: Optional[Schedule] = None, seed: int = 0):
        own = "DGC"
        self.sparsity = check_range(own, "sparsity", sparsity, 0.0, 1.0, high_open=True)
        super().__init__(own, momentum, nesterov, masking, clip_norm, weight_decay, min_numel, warmup)
        self.sample_ratio = check_range(own, "sample_ratio", sample_ratio, 0.0, 1.0, low_open=True)
        self.upper = check_range(own, "upper", upper, 1.0, math.inf, low_open=True)
        self.lower = check_range(own, "lower", lower, 0.0, 1.0, low_open=True, high_open=True)
        self.max_adaptation_iters = check_int(own, "max_adaptation_iters", max_adaptation_iters, 0)
        self.resample = check_bool(own, "resample", resample)
        self.fp16_values = check_bool(own, "fp16_values", fp16_values)
        self.seed = check_int(own, "seed", seed, 0)

    @property
    def target_sparsity(self) -> float:
        return self.sparsity

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        prepared = self.prepare(ops, x, state, info)
        if isinstance(prepared, Packet):
            return prepared
        g, mu, nesterov = prepared
        selection = self.fused_select(ops, g, mu, nesterov, state, info) if FUSED else None
        if selection is None:
            u, v = ops.momentum_correction(state["momentum"], state["velocity"], g, mu, nesterov)
            selection = self.select(ops, v, 1.0 - self.current_sparsity, info)
            self.release(ops, state, u, v, selection[1])
        values, indices = selection
        if self.fp16_values:
            values = ops.half_cast(values, "float16")
        packet = self.packet(ops, values, indices, info)
        packet.ctx = ops.dtype(x)
        return packet

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        if len(tensors) == 1:  # dense
            return ops.into(out, tensors[0])
        values, indices = tensors
        return super().decompress(ops, [ops.cast(values, ctx), indices], ctx, info, out)

    def adapt(self, ops: Ops, v32: Tensor, threshold: Scalar, count: int, k: int) -> Scalar:
        """The sampled threshold adapted to the count it selects (``count``, known from its
        selection): while that count is below ``lower·k`` (or above ``upper·k`` without
        ``resample``) the threshold is scaled by ``lower`` (``upper``) and the count taken again,
        at most ``max_adaptation_iters`` times. Returns ``threshold`` itself when ``count`` is
        in range.

        On the host (the C++ kernels' Python numbers) the loop stops at the first count in
        range. On a device the later thresholds and counts are 0-d tensors and the loop is
        restated without a host read: every iteration runs, and once a count is in range the
        threshold and count are frozen (``active`` stays false), which gives the host loop's
        result at the price of ``max_adaptation_iters`` counting passes instead of usually one."""
        active = True
        for _ in range(self.max_adaptation_iters):
            too_many = (count > k * self.upper) & (not self.resample)
            too_few = count < k * self.lower
            active = active & (too_many | too_few)
            if active is False:
                break
            threshold = ops.choose(active & too_few, threshold * self.lower,
                                   ops.choose(active & too_many, threshold * self.upper, threshold))
            count = ops.choose(active, ops.count_ge(v32, threshold), count)
        return threshold

    def sample(self, n: int, density: float, info: TensorInfo) -> tuple:
        """``(k, start, stride, sampled, top)``: the count wanted and the sample the threshold is
        taken from, its ``top``-th largest magnitude (see the module doc)."""
        k = resolve_k(density, n)
        wanted = max(math.ceil(n * self.sample_ratio), math.ceil(2.0 / density))
        start, stride, sampled = 0, 1, not (self.sample_ratio >= 1.0 or n <= wanted)
        if sampled:
            stride = max(1, n // wanted)
            stride -= 1 if stride > 1 and stride % 2 == 0 else 0
            start = step_key(self.seed, self._step, info.name) % stride
        samples = (n - start + stride - 1) // stride
        return k, start, stride, sampled, resolve_k(density, samples)

    def fused_select(self, ops: Ops, g: Tensor, mu: float, nesterov: bool, state: dict,
                     info: TensorInfo) -> Optional[tuple]:
        """Momentum correction, :meth:`select` and :meth:`release` in one pass over the data
        (the C++ kernels' ``dgc_select``), with the same results: ``(values, indices)``, the
        state stored. The pass keeps its selection when the count needs neither adaptation nor
        resampling (``low <= count <= high``, as :meth:`select` decides); else the selection is
        made again from its threshold and count, as :meth:`select` does. None (nothing done)
        where the kernel does not apply: not float32, or not the C++ kernels."""
        u, v, n = state["momentum"], state["velocity"], info.numel
        if n == 0 or not all(ops._is_flat_float32(t) for t in (g, u, v)) or not ops.host_kernel("dgc_select", g):
            return None
        k, start, stride, sampled, top = self.sample(n, 1.0 - self.current_sparsity, info)
        low = math.ceil(k * self.lower) if sampled and self.max_adaptation_iters else 0
        high = math.floor(k * self.upper) if sampled and (self.resample or self.max_adaptation_iters) else n
        u, v, values, indices, count, threshold = ops.dgc_select(
            g, u, v, mu, nesterov, start, stride, top, k, low, high, self.masking)
        if low <= count <= high:  # selected and released by the pass
            ops.write(state, "momentum", u)
            ops.write(state, "velocity", v)
            return values, indices
        values, indices = ops.select_ge(v, threshold)
        values, indices = self.finish_select(ops, v, v, threshold, values, indices, k, sampled)
        self.release(ops, state, u, v, indices)
        return values, indices

    def select(self, ops: Ops, v: Tensor, density: float, info: TensorInfo) -> tuple:
        """``(values, indices)`` of about ``⌈n·density⌉`` largest-magnitude elements of ``v``
        (see the module doc); magnitudes are compared in float32."""
        k, start, stride, sampled, top = self.sample(info.numel, density, info)
        v32 = v if ops.dtype(v) == "float32" else ops.cast(v, "float32")
        threshold = ops.sampled_threshold(v32, start, stride, top)
        if not isinstance(threshold, float):  # a device tensor: scaled in float64, as a Python float
            threshold = ops.cast(threshold, "float64")  # (rounded to float32 where compared, as in C++)
        # NaNs fill the sample's top: send the non-finite elements
        threshold = ops.choose(threshold != threshold, math.inf, threshold)
        # Select first: the selection's size (a host read on a device) is the count that adapt
        # starts from, so no counting pass precedes the selection; a second selection (and host
        # read) only when that count was out of range.
        values, indices = ops.select_ge(v32, threshold)
        return self.finish_select(ops, v, v32, threshold, values, indices, k, sampled)

    def finish_select(self, ops: Ops, v: Tensor, v32: Tensor, threshold: Any, values: Tensor,
                      indices: Tensor, k: int, sampled: bool) -> tuple:
        """:meth:`select` after its first selection ``(values, indices)`` at ``threshold``:
        adaptation, resampling or truncation to ``k``."""
        if sampled and self.max_adaptation_iters:
            adapted = self.adapt(ops, v32, threshold, ops.numel(values), k)
            if adapted is not threshold:
                values, indices = ops.select_ge(v32, adapted)
        count = ops.numel(values)
        if sampled and self.resample and count > k * self.upper:
            values, best = ops.topk_abs(values, k)
            indices = ops.gather(indices, best)
        elif count > k:
            values, indices = (ops.split(t, [k, count - k])[0] for t in (values, indices))
        return (values if v32 is v else ops.gather(v, indices)), indices
