"""Each core compressor on torch tensors against a small numpy reference written here."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from randomk_reference import np_shared_indices, strata

import hvdcompress as hc
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.ops.torch_ops import TorchOps

OPS = TorchOps()


def grad(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def roundtrip(comp, x: np.ndarray, state=None, info=None, steps=1):
    """Compress ``x`` (numpy) on one rank; return (packet tensors as numpy, decompressed, state)."""
    info = info or TensorInfo(name="w", numel=x.size)
    state = {} if state is None else state
    t = torch.from_numpy(x.copy())
    comp.init_state(OPS, t, state, info)
    packet = comp.compress(OPS, t, state, info)
    dense = comp.decompress(OPS, packet.tensors, packet.ctx, info)
    return [p.numpy() for p in packet.tensors], dense.numpy(), state, packet


# ---- numpy references -------------------------------------------------------------------------
def np_topk(x: np.ndarray, k: int):
    idx = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    return x[idx], idx


def np_dense(n: int, idx, values) -> np.ndarray:
    out = np.zeros(n, dtype=np.float32)
    np.add.at(out, idx, values)
    return out


def np_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even) -> float32."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded.astype(np.uint32) << 16).view(np.float32)


# ---- tests --------------------------------------------------------------------------------------
def test_none_is_identity():
    x = grad(100)
    (payload,), dense, _, packet = roundtrip(hc.NoCompression(), x)
    assert packet.summable
    np.testing.assert_array_equal(payload, x)
    np.testing.assert_array_equal(dense, x)


def test_fp16_matches_numpy_cast():
    x = grad(1000) * 10
    (payload,), dense, _, packet = roundtrip(hc.FP16(), x)
    assert payload.dtype == np.float16 and packet.summable
    np.testing.assert_array_equal(payload, x.astype(np.float16))
    np.testing.assert_array_equal(dense, x.astype(np.float16).astype(np.float32))


def test_bf16_matches_round_to_nearest_even():
    x = np.concatenate([grad(1000) * 1e3, np.float32([1.00390625, 1.01171875, -3.0e38])])
    (payload,), dense, _, packet = roundtrip(hc.BF16(), x)
    assert payload.dtype == np.int16 and not packet.summable  # Horovod has no bf16: int16 bits
    np.testing.assert_array_equal(dense, np_bf16(x))


@pytest.mark.parametrize("k,expected", [(0.05, 50), (7, 7), (5000, 1000), (1.0, 1000)])
def test_topk_matches_numpy(k, expected):
    x = grad(1000, seed=3)
    (values, indices), dense, _, packet = roundtrip(hc.TopK(k), x)
    ref_values, ref_idx = np_topk(x, expected)
    assert not packet.summable and indices.dtype == np.int32
    np.testing.assert_array_equal(indices, ref_idx)
    np.testing.assert_array_equal(values, ref_values)
    np.testing.assert_array_equal(dense, np_dense(1000, ref_idx, ref_values))


def test_topk_sends_nan_and_inf():
    x = grad(100)
    x[[3, 50]] = [np.nan, -np.inf]
    (values, indices), _, _, _ = roundtrip(hc.TopK(2), x)
    assert list(indices) == [3, 50]
    assert np.isnan(values[0]) and values[1] == -np.inf


def test_randomk_draws_shared_counter_based_indices():
    x = grad(1000)
    comp = hc.RandomK(0.02, seed=7, scale=True)
    state = {}
    for step in range(2):
        (values,), dense, state, packet = roundtrip(comp, x, state, TensorInfo("layer.w", 1000))
        idx = np_shared_indices(1000, 20, zlib.crc32(f"7:{step}:layer.w".encode()))
        assert len(set(idx)) == 20
        assert packet.summable
        np.testing.assert_array_equal(values, x[idx] * np.float32(1000 / 20))
        np.testing.assert_array_equal(dense, np_dense(1000, idx, x[idx] * np.float32(50)))


def test_randomk_draws_one_index_per_stratum_and_scales_by_its_size():
    """n = 103, k = 10: strata of 10 and 11 elements; with scale=True each value is multiplied by
    its stratum's size, so the estimate is unbiased for every element."""
    x = grad(103)
    (values,), _, _, _ = roundtrip(hc.RandomK(10, seed=3, scale=True), x, {}, TensorInfo("w", 103))
    key = zlib.crc32(b"3:0:w")
    idx = np_shared_indices(103, 10, key)
    sizes = np.array([size for _, size in strata(103, 10)], np.float32)
    assert sorted(set(sizes)) == [10, 11]
    assert all(first <= i < first + size for i, (first, size) in zip(idx, strata(103, 10)))
    np.testing.assert_array_equal(values, x[idx] * sizes)


def test_randomk_inclusion_is_uniform_within_each_stratum():
    """Statistics of the draw: over 4,000 keys every element of [0, 50) with k = 5 (strata of
    10) is picked about 400 times (binomial sd 19; bound at 6 sd)."""
    from hvdcompress.ops.facade import Ops
    counts = np.zeros(50)
    for key in range(4000):
        counts[Ops.shared_indices(TorchOps(kernels=False), 50, 5, key, torch.zeros(1)).numpy()] += 1
    assert np.abs(counts - 400).max() < 6 * 19


def test_error_feedback_matches_numpy_and_loses_nothing():
    comp = hc.ErrorFeedback(hc.TopK(10))
    state, e, sent = {}, np.zeros(200, np.float32), np.zeros(200, np.float32)
    gs = [grad(200, seed=s) for s in range(6)]
    for g in gs:
        (values, indices), dense, state, _ = roundtrip(comp, g, state)
        p = g + e
        ref_values, ref_idx = np_topk(p, 10)
        e = p - np_dense(200, ref_idx, ref_values)
        np.testing.assert_array_equal(indices, ref_idx)
        np.testing.assert_array_equal(values, ref_values)
        np.testing.assert_array_equal(state["residual"].numpy(), e)
        sent += dense
    np.testing.assert_allclose(sent + state["residual"].numpy(), np.sum(gs, axis=0), atol=1e-5)


def test_error_feedback_drops_non_finite_residuals():
    x = grad(50)
    x[4] = np.nan
    _, _, state, _ = roundtrip(hc.ErrorFeedback(hc.TopK(3)), x)
    assert np.isfinite(state["residual"].numpy()).all()


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_decorator_matches_numpy(nesterov):
    comp = hc.Momentum(hc.TopK(20), mu=0.9, nesterov=nesterov)
    state, m = {}, np.zeros(300, np.float32)
    for s in range(4):
        g = grad(300, seed=s)
        (values, indices), _, state, _ = roundtrip(comp, g, state)
        m = m * np.float32(0.9) + g
        ref_values, ref_idx = np_topk(g + m * np.float32(0.9) if nesterov else m, 20)
        np.testing.assert_array_equal(indices, ref_idx)
        np.testing.assert_array_equal(values, ref_values)


def np_dgc_step(g, u, v, density, mu, nesterov, masking, wd=0.0, w=None):
    """One exact-threshold DGC step (all elements sampled) in numpy."""
    if wd:
        g = g + w * np.float32(wd)
    if nesterov:
        u = (u + g) * np.float32(mu)
        v = v + u + g
    else:
        u = u * np.float32(mu) + g
        v = v + u
    k = math.ceil(round(g.size * density, 6))  # 1 - 0.99 of 400 is 4 (float noise dropped)
    mag = np.abs(v)
    threshold = np.sort(mag)[-k]
    idx = np.nonzero(mag >= threshold)[0][:k]
    values = v[idx].copy()
    v = v.copy()
    v[idx] = 0
    if masking:
        u = u.copy()
        u[idx] = 0
    return values, idx, u, v


@pytest.mark.parametrize("nesterov,masking,wd", [(False, True, 0.0), (True, True, 0.0),
                                                 (False, False, 1e-2), (True, False, 5e-4)])
def test_dgc_exact_threshold_matches_numpy(nesterov, masking, wd):
    n, sparsity = 400, 0.99  # n <= 2/density: every element is a sample, the threshold is exact
    comp = hc.DGC(sparsity, momentum=0.9, nesterov=nesterov, masking=masking, weight_decay=wd,
                  min_numel=0)
    w = grad(n, seed=99)
    info = TensorInfo("w", n, param=torch.from_numpy(w))
    state, u, v = {}, np.zeros(n, np.float32), np.zeros(n, np.float32)
    for s in range(5):
        g = grad(n, seed=s)
        (values, indices), dense, state, packet = roundtrip(comp, g, state, info)
        ref_values, ref_idx, u, v = np_dgc_step(g, u, v, 1 - sparsity, 0.9, nesterov, masking, wd, w)
        assert not packet.summable
        np.testing.assert_array_equal(indices, ref_idx)
        np.testing.assert_array_equal(values, ref_values)
        np.testing.assert_array_equal(state["momentum"].numpy(), u)
        np.testing.assert_array_equal(state["velocity"].numpy(), v)
        np.testing.assert_array_equal(dense, np_dense(n, ref_idx, ref_values))


def test_dgc_local_clipping_scales_by_sqrt_world():
    n = 400
    comp = hc.DGC(0.99, momentum=0.0, clip_norm=1.0, min_numel=0)
    g = grad(n) * 10
    info = TensorInfo("w", n, world=4)
    _, _, state, _ = roundtrip(comp, g, None, info)
    sent_plus_kept = state["velocity"].numpy()
    clipped = g * min(1.0, 0.5 / (np.linalg.norm(g) + 1e-6))  # 1.0 / sqrt(4)
    kept = np.abs(sent_plus_kept) > 0
    np.testing.assert_allclose(sent_plus_kept[kept], clipped[kept], rtol=1e-5)


def test_dgc_small_tensors_and_zero_sparsity_are_dense_momentum():
    g = grad(100)
    for comp in (hc.DGC(0.999, momentum=0.5), hc.DGC(0.0, momentum=0.5, min_numel=0)):
        state = {}
        for _ in range(2):
            (payload,), _, state, packet = roundtrip(comp, g, state)
        assert packet.summable
        np.testing.assert_array_equal(payload, g * np.float32(0.5) + g)


def test_dgc_sampled_threshold_statistics():
    n, sparsity = 200_000, 0.99
    k = math.ceil(round(n * (1 - sparsity), 6))
    comp = hc.DGC(sparsity, momentum=0.0, min_numel=0)
    g = grad(n, seed=5)
    (values, indices), _, state, _ = roundtrip(comp, g, None, TensorInfo("big", n))
    assert 0.8 * k <= len(indices) <= k
    assert len(np.unique(indices)) == len(indices)
    np.testing.assert_array_equal(values, g[indices])
    # the selected are the large ones: all above the 97th percentile of |g| (top 1% wanted)
    assert np.abs(values).min() >= np.quantile(np.abs(g), 0.97)
    # what was not sent stays in the velocity, what was sent is cleared
    v = state["velocity"].numpy()
    assert (v[indices] == 0).all()
    rest = np.setdiff1d(np.arange(n), indices)
    np.testing.assert_array_equal(v[rest], g[rest])


def test_dgc_fp16_values_halve_value_bytes():
    g = grad(400)
    (values, indices), dense, _, _ = roundtrip(hc.DGC(0.9, momentum=0.0, min_numel=0, fp16_values=True), g)
    assert values.dtype == np.float16
    np.testing.assert_array_equal(dense[indices], g[indices].astype(np.float16).astype(np.float32))


def test_integer_gradient_is_a_type_error():
    t = torch.arange(10)
    info = TensorInfo("ints", 10)
    for comp in (hc.FP16(), hc.TopK(2), hc.DGC(0.9), hc.RandomK(2)):
        with pytest.raises(TypeError, match="ints.*int64"):
            comp.init_state(OPS, t, {}, info)
            comp.compress(OPS, t, {}, info)


def test_decompress_gathered_sums_ranks_payloads():
    """Concatenated sparse payloads of two ranks scatter-add to the sum of their dense tensors."""
    comp, info = hc.TopK(5), TensorInfo("w", 50)
    a, b = grad(50, 1), grad(50, 2)
    pa, pb = (comp.compress(OPS, torch.from_numpy(x), {}, info) for x in (a, b))
    cat = [torch.cat([ta, tb]) for ta, tb in zip(pa.tensors, pb.tensors)]
    total = comp.decompress_gathered(OPS, cat, None, info, world=2).numpy()
    va, ia = np_topk(a, 5)
    vb, ib = np_topk(b, 5)
    np.testing.assert_array_equal(total, np_dense(50, ia, va) + np_dense(50, ib, vb))


@pytest.mark.parametrize("make", [lambda: hc.Dithering(levels=4, seed=1), lambda: hc.TernGrad(seed=1),
                                  lambda: hc.Natural(seed=1)])
def test_stochastic_rounding_is_independent_across_ranks(make):
    """Ranks draw different streams, so the average over R ranks' roundings of the same gradient
    has about 1/R of one rounding's squared error (identical streams would not shrink it)."""
    x = grad(20_000, seed=4)
    outs = [roundtrip(make(), x, info=TensorInfo("w", x.size, rank=r))[1] for r in range(16)]
    assert not np.array_equal(outs[0], outs[1])
    single = np.mean((outs[0] - x) ** 2)
    averaged = np.mean((np.mean(outs, axis=0) - x) ** 2)
    assert averaged < single / 8  # 1/16 expected
