"""The quantisers, threshold and PowerSGD on both kernel paths against numpy references written
here: deterministic ones exactly, stochastic ones by unbiasedness and by their rounding rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hvdcompress as hc
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.ops.torch_ops import TorchOps


@pytest.fixture(params=["kernels", "fallback"])
def ops(request) -> TorchOps:
    return TorchOps(kernels=request.param == "kernels")


def grad(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def info_for(x: np.ndarray, shape=None, name="w") -> TensorInfo:
    return TensorInfo(name=name, numel=x.size, shape=tuple(shape or x.shape))


def compress(ops, comp, x: np.ndarray, state=None, info=None):
    info = info or info_for(x)
    state = {} if state is None else state
    xt = torch.from_numpy(x.copy())
    comp.init_state(ops, xt, state, info)
    return comp.compress(ops, xt, state, info), state, info


def roundtrip(ops, comp, x, state=None, info=None) -> np.ndarray:
    packet, state, info = compress(ops, comp, x, state, info)
    return comp.decompress(ops, packet.tensors, packet.ctx, info).numpy()


def gathered(ops, comp, xs: list, states=None) -> np.ndarray:
    """Compress every rank's gradient, concatenate the payloads as allgather does, decompress."""
    states = states or [{} for _ in xs]
    packets = [compress(ops, comp, x, s)[0] for x, s in zip(xs, states)]
    tensors = [torch.cat([p.tensors[i] for p in packets]) for i in range(len(packets[0].tensors))]
    info = info_for(xs[0])
    return comp.decompress_gathered(ops, tensors, packets[0].ctx, info, len(xs)).numpy()


def signs(x: np.ndarray) -> np.ndarray:
    return np.where(np.signbit(x), np.float32(-1), np.float32(1))


# ---- sign compressors -------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [True, False])
def test_onebit_matches_numpy_on_each_rank_and_gathered(ops, scale):
    xs = [grad(1001, r) for r in range(3)]
    def ref(x):
        s = np.float32(np.abs(x).astype(np.float64).mean()) if scale else np.float32(1)
        return signs(x) * s
    np.testing.assert_allclose(roundtrip(ops, hc.OneBit(scale), xs[0]), ref(xs[0]), rtol=1e-6)
    want = ref(xs[0]) + ref(xs[1]) + ref(xs[2])
    np.testing.assert_allclose(gathered(ops, hc.OneBit(scale), xs), want, rtol=1e-6, atol=1e-6)


def test_onebit_payload_is_one_bit_per_element(ops):
    packet, _, _ = compress(ops, hc.OneBit(), grad(1001))
    assert [p.numel() for p in packet.tensors] == [126, 1]
    assert not packet.summable


def np_onebit_runs(x: np.ndarray, run: int) -> np.ndarray:
    """Signs times the mean |x| of each run of ``run`` elements (the last one shorter)."""
    flat = x.reshape(-1)
    means = [np.float32(np.abs(flat[i:i + run]).astype(np.float64).mean()) for i in range(0, flat.size, run)]
    return signs(flat) * np.repeat(np.array(means, np.float32), run)[:flat.size]


@pytest.mark.parametrize("chunk, shape, run", [(64, (1001,), 64), (1, (5,), 1), ("rows", (33, 31), 62),
                                               ("rows", (10, 100), 100), ("rows", (1001,), 1001)])
def test_onebit_scale_per_run_matches_numpy(ops, chunk, shape, run):
    """``chunk=c``: a scale per c elements; ``"rows"``: per row of numel/shape[0] elements, whole
    rows of >= 32 elements sharing one (31 -> 62); a 1-D tensor keeps one scale. Each rank's
    payload, and three ranks' decoded sum (in rank order), against numpy."""
    comp = hc.OneBit(chunk=chunk)
    xs = [grad(int(np.prod(shape)), r) for r in range(3)]   # flat, as the wrappers give them
    info = info_for(xs[0], shape)
    packet, _, _ = compress(ops, comp, xs[0], info=info)
    assert [p.numel() for p in packet.tensors] == [-(-xs[0].size // 8), -(-xs[0].size // run)]
    np.testing.assert_allclose(roundtrip(ops, comp, xs[0], info=info), np_onebit_runs(xs[0], run), rtol=1e-6)
    packets = [compress(ops, comp, x, info=info)[0] for x in xs]
    tensors = [torch.cat([p.tensors[i] for p in packets]) for i in range(2)]
    got = comp.decompress_gathered(ops, tensors, packets[0].ctx, info, 3).numpy()
    want = np_onebit_runs(xs[0], run) + np_onebit_runs(xs[1], run) + np_onebit_runs(xs[2], run)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_onebit_zero_row_is_sent_as_zero_with_row_scales(ops):
    """An embedding row without gradient costs nothing: its scale is 0 (one scale would send
    +mean|g| for each of its elements)."""
    x = grad(64 * 8)
    x[192:256] = 0.0   # row 3 of (8, 64)
    np.testing.assert_array_equal(roundtrip(ops, hc.OneBit(chunk="rows"), x, info=info_for(x, (8, 64)))[192:256], 0.0)
    assert np.all(roundtrip(ops, hc.OneBit(), x, info=info_for(x, (8, 64)))[192:256] > 0)


@pytest.mark.parametrize("chunk, says", [(0, "chunk=0"), ("row", "chunk='row'"), (True, "chunk=True")])
def test_onebit_bad_chunk_is_named(chunk, says):
    with pytest.raises((ValueError, TypeError), match=says.replace("(", r"\(")):
        hc.OneBit(chunk=chunk)


def test_the_adam_take_over_gives_onebit_row_scales_unless_chosen():
    """FrozenAdam turns onebit's ``chunk="auto"`` into ``"rows"``; an explicit choice stays."""
    assert hc.from_params({"compressor": "onebit", "ef": "vanilla", "adam": "frozen"}).unwrap().chunk == "rows"
    assert hc.from_params({"compressor": "onebit", "ef": "vanilla", "adam": "frozen",
                           "chunk": "none"}).unwrap().chunk is None
    assert hc.from_params({"compressor": "onebit", "chunk": "128"}).unwrap().chunk == 128
    assert hc.from_params({"compressor": "onebit"}).unwrap().runs(TensorInfo("w", 100, shape=(10, 10))) is None


def test_efsignsgd_matches_numpy_and_loses_nothing(ops):
    comp, state, e = hc.EFSignSGD(), {}, np.zeros(777, np.float32)
    sent_total, grad_total = np.zeros(777), np.zeros(777)
    for step in range(5):
        x = grad(777, step)
        got = roundtrip(ops, comp, x, state)
        p = x + e
        s = np.float32(np.abs(p).astype(np.float64).mean())
        want = signs(p) * s
        e = p - want
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(state["quant_residual"].numpy(), e, rtol=1e-5, atol=1e-6)
        sent_total += got
        grad_total += x
    np.testing.assert_allclose(sent_total + state["quant_residual"].numpy(), grad_total, atol=1e-4)


def test_signum_takes_the_majority_vote(ops):
    xs = [grad(999, r) for r in range(3)]
    vote = np.sign(sum(signs(x) for x in xs))
    np.testing.assert_array_equal(gathered(ops, hc.Signum(), xs), 3 * vote)
    # two ranks that disagree give 0 there
    tie = gathered(ops, hc.Signum(), [xs[0], -xs[0]])
    assert np.all(tie == 0)


# ---- two bits ---------------------------------------------------------------------------------
def np_mxnet_twobit(xs, t):
    """MXNet's quantize_2bit: r += g; send +t/-t where r crosses; r -= sent."""
    r, out = np.zeros_like(xs[0]), []
    for x in xs:
        r = r + x
        sent = np.where(r >= t, t, np.where(r <= -t, -t, 0)).astype(np.float32)
        r = r - sent
        out.append(sent)
    return out, r


def test_twobit_is_mxnet_with_its_residual(ops):
    xs = [grad(1003, s) * 0.4 for s in range(4)]
    want, want_residual = np_mxnet_twobit(xs, np.float32(0.5))
    comp, state = hc.TwoBit(0.5), {}
    for x, w in zip(xs, want):
        np.testing.assert_array_equal(roundtrip(ops, comp, x, state), w)
    np.testing.assert_array_equal(state["quant_residual"].numpy(), want_residual)


def test_twobit_fused_residual_equals_error_feedback_around_the_stateless_one(ops):
    xs = [grad(500, s) * 0.4 for s in range(4)]
    fused, fs = hc.TwoBit(0.3), {}
    wrapped, ws = hc.ErrorFeedback(hc.TwoBit(0.3, residual=False)), {}
    for x in xs:
        np.testing.assert_allclose(roundtrip(ops, fused, x, fs), roundtrip(ops, wrapped, x, ws))


def test_own_residual_compressors_refuse_a_second_residual(ops):
    for comp in (hc.TwoBit(0.5), hc.EFSignSGD(), hc.PowerSGD()):
        x = grad(64)
        with pytest.raises(ValueError, match="own error-feedback residual"):
            compress(ops, hc.ErrorFeedback(comp), x, info=info_for(x, (8, 8)))


def test_twobit_nan_reaches_the_decoder(ops):
    x = grad(10)
    x[4] = np.nan
    out = roundtrip(ops, hc.TwoBit(0.5, residual=False), x)
    assert np.isnan(out[4]) and np.isfinite(np.delete(out, 4)).all()


# ---- int8 min-max -----------------------------------------------------------------------------
def np_int8(x, chunk):
    out = np.empty_like(x)
    for c in range(0, x.size, chunk):
        v = x[c:c + chunk]
        mn, mx = v.min(), v.max()
        span = np.float32(mx - mn)
        inv = np.float32(255) / span if span > 0 else np.float32(0)
        q = np.clip(np.rint((v - mn) * inv), 0, 255).astype(np.float32)
        out[c:c + chunk] = mn + q * (span / np.float32(255))
    return out


def test_int8_matches_bagua_minmax(ops):
    xs = [grad(5000, r) for r in range(2)]
    np.testing.assert_array_equal(roundtrip(ops, hc.Int8(512), xs[0]), np_int8(xs[0], 512))
    want = np_int8(xs[0], 512) + np_int8(xs[1], 512)
    np.testing.assert_array_equal(gathered(ops, hc.Int8(512), xs), want)


def test_int4_matches_numpy_and_sends_half_a_byte_per_element(ops):
    """Int4 (FrozenAdam's long warm-up around top-k): min-max with 15 steps per chunk, two codes
    per byte; numpy's codes rounded half to even, decoded as min + code · (max - min) / 15."""
    from test_kernels import np_minmax, np_minmax_sum
    xs = [grad(5001, r) for r in range(2)]
    packet, _, _ = compress(ops, hc.Int4(512), xs[0])
    assert packet.tensors[0].numel() == 2501 and packet.tensors[1].numel() == 2 * 10
    np.testing.assert_array_equal(packet.tensors[0].numpy(), np_minmax(xs[0], 512, 4)[0])
    want = np_minmax_sum([np_minmax(x, 512, 4) for x in xs], 5001, 512, 4)
    np.testing.assert_array_equal(gathered(ops, hc.Int4(512), xs), want)
    assert np.abs(roundtrip(ops, hc.Int4(512), xs[0]) - xs[0]).max() > 10 * np.abs(
        roundtrip(ops, hc.Int8(512), xs[0]) - xs[0]).max()   # 17x coarser steps than int8
    with pytest.raises(ValueError, match="Int4: chunk=511; allowed: an even number"):
        hc.Int4(511)


def test_int8_keeps_the_gradient_dtype(ops):
    x = grad(300).astype(np.float16)
    out = roundtrip(ops, hc.Int8(100), x)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, x, atol=0.02)


# ---- stochastic quantisers --------------------------------------------------------------------
STOCHASTIC = [
    lambda seed: hc.Dithering(levels=8, partition="natural", norm="max", seed=seed),
    lambda seed: hc.Dithering(levels=5, partition="linear", norm="l2", seed=seed),
    lambda seed: hc.QSGD(levels=4, seed=seed),
    lambda seed: hc.TernGrad(seed=seed),
    lambda seed: hc.Natural(seed=seed),
]


@pytest.mark.parametrize("make", STOCHASTIC)
def test_stochastic_quantisers_are_unbiased(ops, make):
    x = grad(64, 3)
    comp, state = make(1), {}
    runs = np.stack([roundtrip(ops, comp, x, state) for _ in range(3000)]).astype(np.float64)
    mean, sem = runs.mean(0), runs.std(0) / np.sqrt(len(runs))
    assert np.all(np.abs(mean - x) < 5 * sem + 1e-5 * np.abs(x)), np.max(np.abs(mean - x) / sem)
    assert runs.std(0).max() > 0  # really random


def dithering_grid(comp, norm: float) -> np.ndarray:
    if comp.partition == "natural" and comp.levels > 1:
        return np.concatenate([[0.0], 2.0 ** (np.arange(1, comp.levels + 1) - comp.levels)]) * norm
    return np.arange(comp.levels + 1) / comp.levels * norm


@pytest.mark.parametrize("make", STOCHASTIC[:4])
def test_dithering_decodes_to_a_neighbouring_level(ops, make):
    x = grad(4000, 4)
    comp = make(0)
    norm = np.abs(x).max() if comp.norm == "max" else np.linalg.norm(x.astype(np.float64))
    grid = dithering_grid(comp, norm)
    out = roundtrip(ops, comp, x)
    low = grid[np.clip(np.searchsorted(grid, np.abs(x), side="right") - 1, 0, len(grid) - 1)]
    high = grid[np.minimum(np.searchsorted(grid, np.abs(x), side="right"), len(grid) - 1)]
    mag = np.abs(out)
    assert np.all(np.isclose(mag, low, rtol=1e-5) | np.isclose(mag, high, rtol=1e-5))
    assert np.all((np.sign(out) == np.sign(x)) | (out == 0))


def test_same_seed_same_codes_and_steps_differ(ops):
    x = grad(1000)
    a = roundtrip(ops, hc.QSGD(4, seed=5), x, {})
    b = roundtrip(ops, hc.QSGD(4, seed=5), x, {})
    np.testing.assert_array_equal(a, b)
    state = {}
    first, second = roundtrip(ops, hc.QSGD(4, seed=5), x, state), roundtrip(ops, hc.QSGD(4, seed=5), x, state)
    assert np.any(first != second)


def test_payload_sizes(ops):
    x = grad(1000)
    sizes = {name: [t.numel() * t.element_size() for t in compress(ops, comp, x)[0].tensors]
             for name, comp in [("terngrad", hc.TernGrad()), ("qsgd", hc.QSGD()),
                                ("natural", hc.Natural()), ("twobit", hc.TwoBit()),
                                ("int8", hc.Int8(500))]}
    assert sizes == {"terngrad": [250, 4], "qsgd": [1000, 4], "natural": [1000, 4],
                     "twobit": [250, 4], "int8": [1000, 16]}


def test_zero_and_nan_gradients(ops):
    zero = np.zeros(100, np.float32)
    for make in STOCHASTIC:
        np.testing.assert_array_equal(roundtrip(ops, make(0), zero), zero)
    x = grad(100)
    x[3] = np.nan
    for comp in (hc.QSGD(), hc.Natural(), hc.Int8(50), hc.OneBit()):
        assert np.isnan(roundtrip(ops, comp, x)).any()


# ---- threshold --------------------------------------------------------------------------------
def test_threshold_sends_exactly_the_large_elements(ops):
    xs = [grad(3000, r) for r in range(2)]
    want = [np.where(np.abs(x) >= 1.5, x, 0) for x in xs]
    np.testing.assert_array_equal(roundtrip(ops, hc.Threshold(1.5), xs[0]), want[0])
    np.testing.assert_array_equal(gathered(ops, hc.Threshold(1.5), xs), want[0] + want[1])


# ---- PowerSGD ---------------------------------------------------------------------------------
def run_powersgd(ops, comp, ms: list, states: list):
    """Both rounds for ``len(ms)`` simulated ranks (allreduce = sum); returns the summed result."""
    infos = [info_for(m.reshape(-1), m.shape) for m in ms]
    firsts = [compress(ops, comp, m.reshape(-1), s, i)[0] for m, s, i in zip(ms, states, infos)]
    p_sum = sum(f.tensors[0] for f in firsts)
    seconds = [f.resume([p_sum.clone()]) for f in firsts]
    q_sum = sum(s.tensors[0] for s in seconds)
    outs = [comp.decompress(ops, [q_sum.clone()], s.ctx, infos[0]) for s in seconds]
    return [o.numpy().reshape(ms[0].shape) for o in outs], firsts


def test_powersgd_matches_numpy_power_iteration(ops):
    rows, cols, rank = 12, 20, 2
    comp = hc.PowerSGD(rank=rank, seed=4)
    states = [{}, {}]
    residuals = [np.zeros((rows, cols), np.float32) for _ in range(2)]
    q = np.random.default_rng([4, __import__("zlib").crc32(b"w")]).standard_normal((cols, rank)).astype(np.float32)
    for step in range(3):
        ms = [grad(rows * cols, 10 * step + r).reshape(rows, cols) for r in range(2)]
        outs, firsts = run_powersgd(ops, comp, ms, states)
        assert all(f.summable for f in firsts) and firsts[0].tensors[0].numel() == rows * rank
        m = [ms[r] + residuals[r] for r in range(2)]
        p_hat, _ = np.linalg.qr(sum(mr @ q for mr in m))
        want = sum(p_hat @ (p_hat.T @ mr) for mr in m)  # invariant to the signs QR picks
        for out in outs:
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        residuals = [mr - p_hat @ (p_hat.T @ mr) for mr in m]
        for r in range(2):
            np.testing.assert_allclose(states[r]["quant_residual"].numpy().reshape(rows, cols),
                                       residuals[r], rtol=1e-4, atol=1e-4)
        q = sum(mr.T @ p_hat for mr in m)  # warm start: the summed Q (up to QR's column signs)
        q = q * np.sign(np.sum(q * (states[0]["powersgd_q"].numpy().reshape(cols, rank)), 0))


def test_powersgd_sends_small_and_one_dimensional_tensors_dense(ops):
    comp = hc.PowerSGD(rank=4)
    for shape in [(100,), (4, 4)]:
        x = grad(int(np.prod(shape)))
        packet, _, _ = compress(ops, comp, x, info=info_for(x, shape))
        assert packet.resume is None and packet.summable
        np.testing.assert_array_equal(comp.decompress(ops, packet.tensors, packet.ctx, info_for(x, shape)).numpy(), x)


# ---- decorators and dtypes --------------------------------------------------------------------
ALL = [hc.OneBit(), hc.Signum(), hc.EFSignSGD(), hc.TwoBit(0.3), hc.Int8(64), hc.Dithering(seed=1),
       hc.QSGD(seed=1), hc.TernGrad(seed=1), hc.Natural(seed=1), hc.Threshold(0.5), hc.PowerSGD()]


@pytest.mark.parametrize("comp", ALL, ids=lambda c: c.name)
def test_momentum_decorator_wraps_every_compressor(ops, comp):
    wrapped, state = hc.Momentum(comp, mu=0.9), {}
    x = grad(256, 1)
    info = info_for(x, (16, 16))
    for _ in range(3):
        packet, state, _ = compress(ops, wrapped, x, state, info)
        if packet.resume is not None:
            packet = packet.resume(packet.tensors)
        out = wrapped.decompress(ops, packet.tensors, packet.ctx, info).numpy()
        assert out.shape == (256,) and np.isfinite(out).all()
    np.testing.assert_allclose(state["momentum"].numpy(), x * (1 + 0.9 + 0.81), rtol=1e-5)


@pytest.mark.parametrize("comp", [c for c in ALL if c.name not in ("efsignsgd", "twobit", "powersgd")],
                         ids=lambda c: c.name)
def test_error_feedback_decorator_loses_nothing(ops, comp):
    wrapped, state = hc.ErrorFeedback(comp), {}
    sent, total = np.zeros(300), np.zeros(300)
    for step in range(4):
        x = grad(300, step)
        sent += roundtrip(ops, wrapped, x, state)
        total += x
    np.testing.assert_allclose(sent + state["residual"].numpy(), total, atol=1e-4)


@pytest.mark.parametrize("comp", ALL, ids=lambda c: c.name)
def test_float16_gradients_come_back_as_float16(ops, comp):
    x = grad(256).astype(np.float16)
    info = info_for(x, (16, 16))
    packet, _, _ = compress(ops, comp, x, info=info)
    if packet.resume is not None:
        packet = packet.resume(packet.tensors)
    assert comp.decompress(ops, packet.tensors, packet.ctx, info).dtype == torch.float16


# ---- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("comp", ALL, ids=lambda c: c.name)
def test_integer_gradients_are_refused(ops, comp):
    x = np.arange(64, dtype=np.int64)
    with pytest.raises(TypeError, match="floating-point"):
        compress(ops, comp, x, info=info_for(x, (8, 8)))


@pytest.mark.parametrize("comp", [hc.OneBit(), hc.TwoBit(), hc.Int8(16), hc.QSGD(), hc.TernGrad(),
                                  hc.Natural(), hc.Threshold(0.1)], ids=lambda c: c.name)
def test_decoders_check_payload_lengths(ops, comp):
    x = grad(100)
    packet, _, info = compress(ops, comp, x)
    first = packet.tensors[0]
    if comp.name == "threshold":
        bad = [packet.tensors[0], packet.tensors[1][:-1]]
    else:
        bad = [first[:-1]] + packet.tensors[1:]
    with pytest.raises(ValueError, match="payload"):
        comp.decompress(ops, bad, packet.ctx, info)
    if comp.name == "threshold":  # variable-length payloads: any total length is valid
        return
    with pytest.raises(ValueError, match="expected"):
        comp.decompress_gathered(ops, packet.tensors, packet.ctx, info, 2)


@pytest.mark.parametrize("make,message", [
    (lambda: hc.Dithering(levels=0), "levels=0"),
    (lambda: hc.Dithering(levels=128), "levels=128"),
    (lambda: hc.Dithering(partition="log"), "partition='log'"),
    (lambda: hc.Dithering(norm="l1"), "norm='l1'"),
    (lambda: hc.QSGD(levels=-1), "levels=-1"),
    (lambda: hc.TwoBit(threshold=0), "threshold=0"),
    (lambda: hc.Threshold(threshold=-1.0), "threshold=-1.0"),
    (lambda: hc.Int8(chunk=0), "chunk=0"),
    (lambda: hc.PowerSGD(rank=0), "rank=0"),
    (lambda: hc.Natural(seed=-2), "seed=-2"),
])
def test_constructor_arguments_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_registry_builds_every_new_compressor():
    specs = {"onebit": {"scale": "false"}, "efsignsgd": {}, "signum": {"momentum": "plain"},
             "threshold": {"threshold": "0.1", "ef": "vanilla"}, "twobit": {"threshold": "0.2"},
             "int8": {"chunk": "1024"}, "dithering": {"levels": "4", "partition": "linear", "seed": "3"},
             "qsgd": {"levels": "16"}, "terngrad": {"seed": "1"}, "natural": {}, "powersgd": {"rank": "2"}}
    for name, params in specs.items():
        comp = hc.from_params({"compressor": name, **params})
        assert comp.name == name
