"""Every kernel of hvdcompress/ops on both torch paths (the C++ kernel library through
hvdcompress.ops.native, and the plain-torch fallback) against numpy references written here. The
C++ path fails (does not skip) when the library is not built."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hvdcompress.ops import native
from hvdcompress.ops.torch_ops import TorchOps

PATHS = ["kernels", "fallback"]


@pytest.fixture(params=PATHS)
def ops(request) -> TorchOps:
    return TorchOps(kernels=request.param == "kernels")


def data(n: int, seed: int = 0, specials: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    if specials and n >= 8:
        x[[1, 3, 5, 6]] = [0.0, -0.0, np.inf, -np.inf]
    return x


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).copy())


# ---- numpy references -------------------------------------------------------------------------
def np_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """First element in the highest bits, zero padded."""
    per = 8 // bits
    padded = np.zeros(-(-codes.size // per) * per, dtype=np.uint32)
    padded[:codes.size] = codes
    shifts = np.array([8 - bits * (j + 1) for j in range(per)], dtype=np.uint32)
    return (padded.reshape(-1, per) << shifts).sum(1).astype(np.uint8)


def np_unpack(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    per = 8 // bits
    shifts = np.array([8 - bits * (j + 1) for j in range(per)], dtype=np.uint32)
    return ((packed.astype(np.uint32)[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:n]


def np_fmix32(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint64)
    m = np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return h


def np_uniform24(n: int, key: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    return np_fmix32((i * np.uint64(0x9E3779B1) + np.uint64(key)) & np.uint64(0xFFFFFFFF)) >> np.uint64(8)


def np_levels(x: np.ndarray, inv: float, levels: int, natural: bool, u: np.ndarray) -> np.ndarray:
    r = np.abs(x) * np.float32(inv)
    r = np.where(np.isnan(r), np.float32(0), r).astype(np.float32)
    if natural:
        r = np.minimum(r, np.float32(2))
        m, e = np.frexp(r)
        big = np.minimum(e + levels - 1 + (u < 2 * m - 1), levels)
        small = (u < r * np.float32(2.0 ** (levels - 1))).astype(np.int64)
        return np.where(r < np.float32(2.0 ** (1 - levels)), small, big)
    r = np.minimum(r, np.float32(levels + 1))
    low = np.floor(r)
    return np.minimum(low.astype(np.int64) + (u < r - low), levels)


def np_minmax(x: np.ndarray, chunk: int, bits: int = 8):
    """Bagua's min-max codes per chunk, 2^bits - 1 steps; 4 bits packed two per byte (np_pack)."""
    top = np.float32(2 ** bits - 1)
    codes, bounds = [], []
    for c in range(0, x.size, chunk):
        v = x[c:c + chunk]
        if not np.isfinite(v).all():
            codes.append(np.zeros(v.size, np.uint8))
            bounds += [np.nan, np.nan]
            continue
        mn, mx = v.min(), v.max()
        span = np.float32(mx - mn)
        inv = top / span if span > 0 else np.float32(0)
        codes.append(np.clip(np.rint((v - mn) * inv), 0, top).astype(np.uint8))
        bounds += [mn, mx]
    codes = np.concatenate(codes)
    return codes if bits == 8 else np_pack(codes, bits), np.array(bounds, dtype=np.float32)


def np_minmax_sum(payloads: list, n: int, chunk: int, bits: int = 8) -> np.ndarray:
    """The float32 sum, in rank order from +0.0, of each (codes, bounds) payload decoded."""
    top, want = np.float32(2 ** bits - 1), np.zeros(n, np.float32)
    for q, b in payloads:
        q = q if bits == 8 else np.unpackbits(q).reshape(-1, 2, 4) @ np.array([8, 4, 2, 1])
        mn, mx = np.repeat(b[0::2], chunk)[:n], np.repeat(b[1::2], chunk)[:n]
        want = want + (mn + q.reshape(-1)[:n].astype(np.float32) * ((mx - mn) / top))
    return want


def np_magnitude_keys(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32) & np.uint32(0x7FFFFFFF)


SIZES = [1, 7, 8, 9, 1000, 70001]


# ---- sign -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_sign_pack_matches_numpy(ops, n):
    x = data(n, specials=True)
    packed, mean = ops.sign_pack(t(x))
    np.testing.assert_array_equal(packed.numpy(), np_pack((~np.signbit(x)).astype(np.uint32), 1))
    finite = np.abs(x[np.isfinite(x)]).astype(np.float64).sum() / n
    if np.isfinite(x).all():
        np.testing.assert_allclose(mean.numpy(), [finite], rtol=1e-6)
    else:
        assert np.isinf(mean.numpy()[0])


def test_sign_pack_mean_is_nan_with_a_nan(ops):
    x = data(100)
    x[10] = np.nan
    assert np.isnan(ops.sign_pack(t(x))[1].item())


@pytest.mark.parametrize("n", [5, 1000, 70001])
def test_ef_sign_pack_matches_numpy(ops, n):
    x, e = data(n, 1), data(n, 2) * 0.1
    residual = t(e)
    packed, scale, residual = ops.ef_sign_pack(t(x), residual)
    p = x + e
    want_scale = np.abs(p).astype(np.float64).mean()
    np.testing.assert_allclose(scale.numpy(), [want_scale], rtol=1e-6)
    np.testing.assert_array_equal(packed.numpy(), np_pack((~np.signbit(p)).astype(np.uint32), 1))
    s = np.float32(scale.item())
    np.testing.assert_array_equal(residual.numpy(), p - np.where(np.signbit(p), -s, s))


# ---- unpack -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 8])
@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 3), (70001, 2), (140005, 3)])  # the last: widened tables
def test_unpack_sum_matches_numpy(ops, bits, n, ranks):
    rng = np.random.default_rng(bits * 100 + n)
    codes = rng.integers(0, 1 << bits, size=(ranks, n)).astype(np.uint32)
    packed = np.concatenate([np_pack(c, bits) for c in codes])
    tables = rng.standard_normal((ranks, 1 << bits)).astype(np.float32)
    want = np.zeros(n, np.float32)
    for r in range(ranks):
        want = want + tables[r][codes[r]]
    got = ops.unpack_sum(t(packed), n, bits, t(tables.reshape(-1)))
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 2), (70001, 3), (1000, 4), (140005, 2)])
def test_sign_vote_matches_numpy(ops, n, ranks):
    xs = [data(n, 20 + r) for r in range(ranks)]
    packed = np.concatenate([np_pack((~np.signbit(x)).astype(np.uint32), 1) for x in xs])
    votes = sum(np.where(np.signbit(x), -1, 1) for x in xs)
    want = (np.sign(votes) * ranks).astype(np.float32)
    np.testing.assert_array_equal(ops.sign_vote(t(packed), n, float(ranks)).numpy(), want)


def test_unpack_sum_rejects_wrong_lengths():
    ops = TorchOps(kernels=True)
    with pytest.raises(ValueError, match="packed has 3 elements"):
        ops.unpack_sum(torch.zeros(3, dtype=torch.uint8), 30, 1, torch.zeros(2))
    with pytest.raises(ValueError, match="tables has 3 entries"):
        ops.unpack_sum(torch.zeros(3, dtype=torch.uint8), 24, 1, torch.zeros(3))


# ---- two bits ---------------------------------------------------------------------------------
def np_twobit(x, t_, residual=None):
    v = x if residual is None else x + residual
    codes = 3 * (v >= t_) + 2 * (v <= -t_) + np.isnan(v)
    sent = np.float32(t_) * ((v >= t_).astype(np.float32) - (v <= -t_).astype(np.float32))
    new = v - sent
    return codes.astype(np.uint32), np.where(np.isfinite(new), new, np.float32(0))


@pytest.mark.parametrize("n", SIZES)
def test_twobit_pack_without_residual(ops, n):
    x = data(n, specials=True)
    if n > 20:
        x[20] = np.nan
    packed, res = ops.twobit_pack(t(x), 0.5)
    assert res is None
    codes, _ = np_twobit(x, np.float32(0.5))
    np.testing.assert_array_equal(packed.numpy(), np_pack(codes, 2))


def test_twobit_pack_with_residual_over_steps(ops):
    n, thr = 5003, np.float32(0.7)
    residual_np = np.zeros(n, np.float32)
    residual = torch.zeros(n)
    for step in range(4):
        x = data(n, step)
        packed, residual = ops.twobit_pack(t(x), float(thr), residual)
        codes, residual_np = np_twobit(x, thr, residual_np)
        np.testing.assert_array_equal(packed.numpy(), np_pack(codes, 2))
        np.testing.assert_array_equal(residual.numpy(), residual_np)


def test_twobit_format_is_mxnet():
    # elements +t, -t, 0, nan -> codes 11 10 00 01 -> one byte 0b11100001
    packed, _ = TorchOps(kernels=True).twobit_pack(torch.tensor([1.0, -1.0, 0.2, float("nan")]), 0.5)
    assert packed.tolist() == [0b11100001]


# ---- stochastic levels ------------------------------------------------------------------------
LEVEL_CASES = [(127, False, 30.0), (4, False, 1.5), (8, True, 0.3), (3, True, 0.3), (1, False, 0.4)]


@pytest.mark.parametrize("levels,natural,inv", LEVEL_CASES)
def test_levels_pack_is_the_documented_rule_bit_for_bit(ops, levels, natural, inv):
    x = data(50001, specials=True)
    x[[7, 9]] = [np.nan, 1e-30]
    key = 123456789
    u = np_uniform24(x.size, key).astype(np.float32) * np.float32(2.0 ** -24)
    level = np_levels(x, inv, levels, natural, u)
    want = np.where(np.isnan(x), -128, np.where(x < 0, -level, level)).astype(np.int8).view(np.uint8)
    got = ops.levels_pack(t(x), inv, levels, natural, key)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("levels,natural,inv", LEVEL_CASES)
def test_levels_pack_rounds_to_a_neighbouring_level(ops, levels, natural, inv):
    x = data(20001, 5)
    codes = ops.levels_pack(t(x), inv, levels, natural, 99).numpy().view(np.int8).astype(np.int64)
    r = np.abs(x).astype(np.float64) * inv
    if natural:
        grid = np.concatenate([[0.0], 2.0 ** (np.arange(1, levels + 1) - levels)])
        low = np.searchsorted(grid, r, side="right") - 1
        low = np.minimum(low, levels)
        high = np.minimum(low + 1, levels)
    else:
        low = np.minimum(np.floor(r), levels).astype(np.int64)
        high = np.minimum(low + 1, levels)
    mag = np.abs(codes)
    assert np.all((mag == low) | (mag == high))
    assert np.all(np.sign(codes[mag > 0]) == np.sign(x[mag > 0]))


@pytest.mark.parametrize("levels,natural,inv", LEVEL_CASES)
def test_levels_pack_is_unbiased(ops, levels, natural, inv):
    x = np.full(200000, 0.0, np.float32)
    x[:100000] = np.float32(0.37 / inv)   # r = 0.37: between two levels of every case
    x[100000:] = np.float32(-0.11 / inv)
    codes = ops.levels_pack(t(x), inv, levels, natural, 7).numpy().view(np.int8).astype(np.float64)
    value = (np.sign(codes) * (2.0 ** (np.abs(codes) - levels)) * (codes != 0)) if natural else codes
    for part, r in ((value[:100000], 0.37), (value[100000:], -0.11)):
        assert abs(part.mean() - r) < 4 * part.std() / np.sqrt(part.size) + 1e-6


def test_ternary_pack_bit_for_bit_and_format(ops):
    x = data(9999, 3, specials=True)
    x[2] = np.nan
    inv, key = 0.5, 42
    u = np_uniform24(x.size, key).astype(np.float32) * np.float32(2.0 ** -24)
    level = np_levels(x, inv, 1, False, u)
    codes = np.where(np.isnan(x), 1, level * np.where(x < 0, 2, 3)).astype(np.uint32)
    got = ops.ternary_pack(t(x), inv, key)
    np.testing.assert_array_equal(got.numpy(), np_pack(codes, 2))


def test_ternary_pack_fallback_is_unbiased():
    x = np.full(100000, 0.3, np.float32)
    codes = np_unpack(TorchOps(kernels=False).ternary_pack(t(x), 1.0, 1).numpy(), x.size, 2)
    assert set(np.unique(codes)) <= {0, 3}
    assert abs((codes == 3).mean() - 0.3) < 0.01


# ---- natural compression ----------------------------------------------------------------------
def np_natural_decode(codes: np.ndarray) -> np.ndarray:
    c = (codes & 0x7F).astype(np.int64)
    mag = np.where(c == 0, 0.0, np.ldexp(1.0, c - 101))
    mag = np.where(c == 127, np.inf, mag)
    out = np.where(codes & 0x80, -mag, mag)
    return np.where(codes == 0x80, np.nan, out)


def np_natural_pack(x: np.ndarray, key: int) -> np.ndarray:
    u24 = np_uniform24(x.size, key)
    a = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
    field = (a >> np.uint32(23)).astype(np.int64)
    e8 = field + (u24 < 2 * (a & np.uint32(0x7FFFFF)).astype(np.uint64))
    c = np.where(e8 < 27, 0, np.where(e8 > 152, 127, e8 - 26))
    c = np.where(field == 0, 0, c) | (np.signbit(x).astype(np.int64) << 7)
    return np.where(a > 0x7F800000, 0x80, c).astype(np.uint8)


def test_natural_pack_bit_for_bit(ops):
    x = data(30001, 4, specials=True)
    x[[10, 11, 12]] = [np.nan, 1e-35, 1e9]
    key = 77
    want = np_natural_pack(x, key)
    np.testing.assert_array_equal(ops.natural_pack(t(x), key).numpy(), want)


def test_natural_pack_rounds_to_neighbouring_powers_and_is_unbiased(ops):
    x = data(100000, 6)
    x[0], x[1] = np.nan, 3e8
    dec = np_natural_decode(ops.natural_pack(t(x), 5).numpy())
    assert np.isnan(dec[0]) and np.isinf(dec[1])
    xs, ds = x[2:].astype(np.float64), dec[2:]
    low = 2.0 ** np.floor(np.log2(np.abs(xs)))
    assert np.all((np.abs(ds) == low) | (np.abs(ds) == 2 * low))
    assert np.all(np.sign(ds) == np.sign(xs))
    y = np.full(100000, 1.3, np.float32)
    mean = np_natural_decode(ops.natural_pack(t(y), 9).numpy()).mean()
    assert abs(mean - 1.3) < 0.01


# ---- min-max 8 and 4 bits ---------------------------------------------------------------------
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,chunk", [(1, 4), (11, 4), (5001, 256), (70001, 2048), (64, 64)])
def test_minmax_pack_and_unpack_match_numpy(ops, n, chunk, bits):
    x = data(n, 8)
    if n > 300:
        x[260] = np.nan
        x[:256] = 1.5  # a constant chunk
    codes, bounds = ops.minmax_pack(t(x), chunk, bits)
    want_codes, want_bounds = np_minmax(x, chunk, bits)
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    np.testing.assert_array_equal(bounds.numpy(), want_bounds)
    packed = [np_minmax(v, chunk, bits) for v in (x, data(n, 9))]
    got = ops.minmax_unpack_sum(t(np.concatenate([q for q, _ in packed])),
                                t(np.concatenate([b for _, b in packed])), n, chunk, bits)
    np.testing.assert_array_equal(got.numpy(), np_minmax_sum(packed, n, chunk, bits))


def test_minmax_4_bits_wants_an_even_chunk(ops):
    for call in (lambda: ops.minmax_pack(torch.zeros(10), 5, 4),
                 lambda: ops.minmax_unpack_sum(torch.zeros(5, dtype=torch.uint8), torch.zeros(4), 10, 5, 4)):
        with pytest.raises(ValueError, match="chunk"):
            call()
    with pytest.raises(ValueError, match="bits=2 is out of range; allowed: 4, 8"):
        ops.minmax_pack(torch.zeros(10), 4, 2)


def np_sign_runs(x: np.ndarray, run: int) -> tuple:
    """numpy's sign_pack_runs: packbits of the sign bits, the mean |x| of each run in float64."""
    means = [np.abs(x[i:i + run]).astype(np.float64).mean() for i in range(0, x.size, run)]
    return np.packbits(~np.signbit(x)), np.array(means, np.float32)


def np_sign_runs_sum(payloads: list, n: int, run: int) -> np.ndarray:
    """The float32 sum, in rank order from +0.0, of each payload's +-scale of its run."""
    want = np.zeros(n, np.float32)
    for codes, scales in payloads:
        scale = np.repeat(scales, run)[:n]
        want = want + np.where(np.unpackbits(codes)[:n] == 1, scale, -scale)
    return want


@pytest.mark.parametrize("n,run", [(1, 4), (10, 3), (5000, 64), (70001, 2048), (64, 64), (4099, 1000)])
def test_sign_runs_pack_and_sum_match_numpy(ops, n, run):
    """A scale per run: the codes of sign_pack, each run's mean |x|; the sum of three payloads
    (+-their run's scale) in rank order from +0.0, -0.0 and NaN included."""
    x = data(n, 10, specials=n > 20)
    packed, means = ops.sign_pack_runs(t(x), run)
    want_packed, want_means = np_sign_runs(x, run)
    np.testing.assert_array_equal(packed.numpy(), want_packed)
    np.testing.assert_array_equal(means.numpy(), want_means)
    payloads = [np_sign_runs(v, run) for v in (x, data(n, 11), -data(n, 12))]
    got = ops.sign_runs_sum(t(np.concatenate([c for c, _ in payloads])),
                            t(np.concatenate([m for _, m in payloads])), n, run)
    np.testing.assert_array_equal(got.numpy(), np_sign_runs_sum(payloads, n, run))


@pytest.mark.parametrize("bits", [8, 4])
def test_minmax_error_is_at_most_half_a_step(ops, bits):
    x = data(10000, 3)
    codes, bounds = ops.minmax_pack(t(x), 1000, bits)
    assert codes.numel() == 10000 * bits // 8
    dec = ops.minmax_unpack_sum(codes, bounds, x.size, 1000, bits).numpy()
    step = np.repeat(bounds.numpy()[1::2] - bounds.numpy()[0::2], 1000) / (2 ** bits - 1)
    assert np.all(np.abs(dec - x) <= step / 2 * 1.001 + 1e-7)


# ---- reductions -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 1000, 200001])
def test_max_abs_matches_numpy(ops, n):
    x = data(n, 14)
    want = np.abs(x).max() if n else 0.0
    assert ops.max_abs(t(x)).item() == want
    if n:
        x[n // 2] = np.nan
        assert np.isnan(ops.max_abs(t(x)).item())


@pytest.mark.parametrize("n", [0, 1, 1000, 200001])
def test_l2_norm_is_the_float64_sum_of_squares(ops, n):
    x = data(n, 15)
    want = np.float32(np.sqrt((x.astype(np.float64) ** 2).sum()))
    assert ops.norm(t(x)).item() == want
    assert ops.norm(t(x).to(torch.float16)).dtype == torch.float32


def test_uniforms_are_the_documented_hash():
    from hvdcompress.ops.torch_fallback import uniform24
    key = 2 ** 32 - 5  # sums wrap around 2**32
    np.testing.assert_array_equal(uniform24(70001, key, "cpu").numpy(), np_uniform24(70001, key))


def test_keys_outside_32_bits_are_value_errors(ops):
    with pytest.raises(ValueError, match="key=4294967296 is out of range"):
        ops.natural_pack(torch.zeros(4), 2 ** 32)


# ---- sparsification ---------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0.0, 1.0, 2.5, 100.0])
def test_count_and_select_ge_match_numpy(ops, threshold):
    x = data(70001, 10, specials=True)
    x[100] = np.nan
    selected = ~(np.abs(x) < threshold)
    assert ops.count_ge(t(x), threshold) == selected.sum()
    values, indices = ops.select_ge(t(x), threshold)
    np.testing.assert_array_equal(indices.numpy(), np.nonzero(selected)[0])
    np.testing.assert_array_equal(values.numpy(), x[selected])


@pytest.mark.parametrize("start,stride,top", [(0, 1, 1), (3, 7, 50), (0, 101, 693)])
def test_sampled_threshold_matches_numpy(ops, start, stride, top):
    x = data(70001, 11)
    x[3 + 7 * 5] = np.nan
    keys = np.sort(np_magnitude_keys(x[start::stride]))[::-1]
    want = keys[top - 1:top].view(np.float32)[0]
    got = ops.sampled_threshold(t(x), start, stride, top)
    assert (np.isnan(got) and np.isnan(want)) or got == want


def np_topk_abs(x: np.ndarray, k: int):
    order = np.argsort(-np_magnitude_keys(x).astype(np.int64), kind="stable")[:k]
    idx = np.sort(order)
    return x[idx], idx


@pytest.mark.parametrize("n,k", [(1, 1), (10, 0), (10, 10), (1000, 17), (70001, 700), (300000, 1)])
def test_topk_abs_matches_numpy_with_ties_to_the_lower_index(ops, n, k):
    x = np.round(data(n, 12) * 4) / 4  # many ties
    if n > 10:
        x[[3, 4]] = [np.nan, -np.inf]
    values, indices = ops.topk_abs(t(x), k)
    want_v, want_i = np_topk_abs(x, k)
    np.testing.assert_array_equal(indices.numpy(), want_i)
    np.testing.assert_array_equal(values.numpy(), want_v)


@pytest.mark.parametrize("crowd", ["zeros", "one_octave_sixteenth"])
@pytest.mark.parametrize("k", [1, 5000, 150000, 300000])
def test_topk_abs_when_most_magnitudes_share_the_top_bits(ops, crowd, k):
    """Most elements in the k-th key's bucket of the kernel's first histogram (its top 16 bits):
    too many candidates to keep, so the kernel counts the low bits in a second pass."""
    n = 300000
    rng = np.random.default_rng(14)
    if crowd == "zeros":  # a sparse gradient: k exceeds the nonzeros
        x = np.zeros(n, np.float32)
        x[::97] = data(-(-n // 97), 15)
    else:  # magnitudes 1 + j * 2^-23, j < 2^12: equal top 16 bits, ties among the low ones
        x = (1.0 + rng.integers(0, 1 << 12, n) * 2.0 ** -23).astype(np.float32)
        x *= np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
        x[[7, 8]] = [2.0, np.nan]
    values, indices = ops.topk_abs(t(x), k)
    want_v, want_i = np_topk_abs(x, k)
    np.testing.assert_array_equal(indices.numpy(), want_i)
    np.testing.assert_array_equal(values.numpy(), want_v)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sparse_sum_matches_numpy(ops, index_dtype):
    rng = np.random.default_rng(13)
    n = 50000
    indices = rng.integers(0, n, 3000).astype(index_dtype)  # repeats across "ranks"
    values = rng.integers(-8, 8, 3000).astype(np.float32)
    want = np.zeros(n, np.float32)
    np.add.at(want, indices, values)
    np.testing.assert_array_equal(ops.sparse_sum(n, t(indices), t(values)).numpy(), want)


# ---- bad input --------------------------------------------------------------------------------
def test_wrong_dtype_is_a_type_error(ops):
    for call in (lambda x: ops.sign_pack(x), lambda x: ops.minmax_pack(x, 16),
                 lambda x: ops.topk_abs(x, 1), lambda x: ops.levels_pack(x, 1.0, 4, False, 0)):
        with pytest.raises(TypeError, match="float32"):
            call(torch.zeros(16, dtype=torch.float64))


def test_non_contiguous_input_is_a_value_error(ops):
    x = torch.zeros(32)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        ops.sign_pack(x)
    with pytest.raises(ValueError, match="contiguous"):
        ops.twobit_pack(torch.zeros(16), 0.5, torch.zeros(32)[::2])


def test_out_of_range_arguments_are_value_errors(ops):
    with pytest.raises(ValueError, match="k=11"):
        ops.topk_abs(torch.zeros(10), 11)
    with pytest.raises(ValueError, match="levels=128"):
        ops.levels_pack(torch.zeros(10), 1.0, 128, False, 0)
    with pytest.raises(ValueError, match="levels=0"):
        ops.levels_pack(torch.zeros(10), 1.0, 0, False, 0)


def test_sparse_sum_rejects_an_index_out_of_range(ops):
    with pytest.raises(IndexError, match="index 10 at position 1"):
        ops.sparse_sum(10, torch.tensor([0, 10], dtype=torch.int32), torch.ones(2))
    with pytest.raises(IndexError, match="index -1 at position 0"):
        ops.sparse_sum(10, torch.tensor([-1, 2]), torch.ones(2))


LOG_PATH = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
from hvdcompress.ops.torch_ops import TorchOps
TorchOps(); TorchOps()
print("uses_kernels", TorchOps().uses_kernels)
"""


@pytest.mark.parametrize("disable,uses,message", [
    ("0", True, "hvdcompress INFO using the C++ kernels"),
    ("1", False, "hvdcompress WARNING HVDCOMPRESS_DISABLE_KERNELS=1; using the pure-torch fallback"),
])
def test_the_path_is_chosen_automatically_and_logged_once(disable, uses, message):
    env = dict(os.environ, HVDCOMPRESS_DISABLE_KERNELS=disable)
    out = subprocess.run([sys.executable, "-c", LOG_PATH], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.count(message) == 1, out  # `make test` builds the extension: it must be in use
    assert f"uses_kernels {uses}" in out


def test_explicit_choice_of_path():
    assert TorchOps(kernels=True).uses_kernels
    assert not TorchOps(kernels=False).uses_kernels


# ---- decoding into a caller's buffer ----------------------------------------------------------
def decoders(n: int) -> dict:
    """Each decoder as f(out) on a 2-rank payload of n elements."""
    rng = np.random.default_rng(40)
    packed1 = t(rng.integers(0, 256, 2 * -(-n // 8)).astype(np.uint8))
    packed8 = t(rng.integers(0, 256, 2 * n).astype(np.uint8))
    tables = t(rng.standard_normal(2 * 256).astype(np.float32))
    bounds = t(np.sort(rng.standard_normal((2 * -(-n // 64), 2)), 1).astype(np.float32).reshape(-1))
    indices = t(rng.integers(0, n, 500).astype(np.int32))
    values = t(rng.standard_normal(500).astype(np.float32))
    return {
        "unpack_sum": lambda ops, out: ops.unpack_sum(packed8, n, 8, tables, out=out),
        "sign_vote": lambda ops, out: ops.sign_vote(packed1, n, 2.0, out=out),
        "minmax_unpack_sum": lambda ops, out: ops.minmax_unpack_sum(packed8, bounds, n, 64, out=out),
        "sign_runs_sum": lambda ops, out: ops.sign_runs_sum(packed1, bounds, n, 32, out=out),
        "sparse_sum": lambda ops, out: ops.sparse_sum(n, indices, values, out=out),
    }


@pytest.mark.parametrize("name", ["unpack_sum", "sign_vote", "minmax_unpack_sum", "sign_runs_sum", "sparse_sum"])
def test_decoders_write_into_the_given_buffer(ops, name):
    n = 70001
    decode = decoders(n)[name]
    want = decode(ops, None)
    out = torch.full((n,), 7.0)  # stale contents must not leak into the result
    got = decode(ops, out)
    assert got.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(out.numpy(), want.numpy())


@pytest.mark.parametrize("name", ["unpack_sum", "sign_vote", "minmax_unpack_sum", "sign_runs_sum", "sparse_sum"])
def test_decoders_reject_a_wrong_buffer(ops, name):
    decode = decoders(1000)[name]
    with pytest.raises(ValueError, match="out has 999 elements"):
        decode(ops, torch.zeros(999))
    with pytest.raises(TypeError, match="out must be a float32"):
        decode(ops, torch.zeros(1000, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        decode(ops, torch.zeros(2000)[::2])


# ---- DGC momentum correction ------------------------------------------------------------------
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("n", [1, 1000, 300001])
def test_momentum_correction_matches_numpy_in_place(ops, nesterov, n):
    g, u, v = data(n, 50, specials=True), data(n, 51), data(n, 52)
    mu = np.float32(0.9)
    if nesterov:
        want_u = (u + g) * mu
        want_v = (v + want_u) + g
    else:
        want_u = u * mu + g
        want_v = v + want_u
    tu, tv = t(u), t(v)
    got_u, got_v = ops.momentum_correction(tu, tv, t(g), 0.9, nesterov)
    np.testing.assert_array_equal(got_u.numpy(), want_u)
    np.testing.assert_array_equal(got_v.numpy(), want_v)
    assert got_u.data_ptr() == tu.data_ptr() and got_v.data_ptr() == tv.data_ptr()


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("u_shift,v_shift", [(0, 0), (1, 1), (3, 1), (0, 2)])
def test_momentum_correction_into_other_buffers_is_the_in_place_result(nesterov, u_shift, v_shift):
    """Outputs other than u and v (TensorFlow's path) take streaming stores when they are aligned
    alike, element stores otherwise: the bits are those of the in-place call either way, at any
    alignment of the outputs (shifted by whole floats inside a larger buffer)."""
    n = 200_003
    g, u, v = data(n, 54, specials=True), data(n, 55), data(n, 56)
    want_u, want_v = native.momentum_correction(g, u.copy(), v.copy(), 0.9, nesterov)
    u_buf, v_buf = np.full(n + 8, 7.0, np.float32), np.full(n + 8, 7.0, np.float32)
    u_out, v_out = u_buf[u_shift:u_shift + n], v_buf[v_shift:v_shift + n]
    got_u, got_v = native.momentum_correction(g, u, v, 0.9, nesterov, u_out=u_out, v_out=v_out)
    assert got_u is u_out and got_v is v_out
    np.testing.assert_array_equal(got_u, want_u)
    np.testing.assert_array_equal(got_v, want_v)
    assert (u_buf[:u_shift] == 7.0).all() and (u_buf[u_shift + n:] == 7.0).all()  # nothing outside
    assert (v_buf[:v_shift] == 7.0).all() and (v_buf[v_shift + n:] == 7.0).all()


# ---- DGC's fused momentum correction and selection -----------------------------------------------
def np_dgc_select(g, u, v, mu, nesterov, start, stride, top, cap, low, high, masking):
    """kernels.h dgc_select: momentum_correction, then the sampled threshold, select_ge and the
    release of the first min(count, cap) selected, when low <= count <= high."""
    mu = np.float32(mu)
    nu = (u + g) * mu if nesterov else u * mu + g
    nv = (v + nu) + g if nesterov else v + nu
    keys = (nv.view(np.uint32) & np.uint32(0x7FFFFFFF))[start::stride]
    kth = np.sort(keys)[::-1][top - 1]
    t = np.float32(np.inf) if kth > 0x7F800000 else np.array([kth], np.uint32).view(np.float32)[0]
    with np.errstate(invalid="ignore"):
        idx = np.nonzero(~(np.abs(nv) < t))[0]
    count = idx.size
    if low <= count <= high:
        idx = idx[:cap]
        vals = nv[idx].copy()
        nv, nu = nv.copy(), nu.copy()
        nv[idx] = 0.0
        nu[idx if masking else idx[~np.isfinite(nu[idx])]] = 0.0
    else:
        idx = idx[:0]
        vals = nv[idx]
    return nu, nv, vals, idx, count, float(t)


def dgc_inputs(n, seed, specials=True):
    g, u, v = data(n, seed, specials=specials), data(n, seed + 1), data(n, seed + 2)
    if specials and n >= 40:
        g[[11, 29]] = [np.nan, -np.inf]  # a NaN and an infinite momentum, both selected
        u[31] = np.nan
    return g, u, v


def assert_dgc_equal(got, want):
    for a, b in zip(got[:4], want[:4]):
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bits, NaNs and -0 included
    assert got[4] == want[4] and (got[5] == want[5] or got[5] != got[5] == want[5] != want[5])


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 1000, 70001, 1_000_003])
@pytest.mark.parametrize("nesterov,masking", [(False, False), (True, False), (False, True), (True, True)])
def test_dgc_select_matches_numpy(ops, n, nesterov, masking):
    """SIMD bodies and tails (16, 8 lanes), several threads (1M), NaN / Inf momenta, the sampled
    and the full sample, cap below and above the count; in place."""
    g, u, v = dgc_inputs(n, 70 + n % 7)
    for start, stride, top, cap in [(0, 1, max(1, n // 100), -(-n // 100)), (n % 3 if n > 3 else 0, 3 if n > 3 else 1, 1, n),
                                    (0, 7 if n > 7 else 1, 2 if n > 14 else 1, 5)]:
        cap = min(cap, n)
        want = np_dgc_select(g, u, v, 0.9, nesterov, start, stride, top, cap, 0, n, masking)
        tu, tv = t(u), t(v)
        got = ops.dgc_select(t(g), tu, tv, 0.9, nesterov, start, stride, top, cap, 0, n, masking)
        assert_dgc_equal((got[0], got[1]) + tuple(got[2:]), want)
        assert got[0].data_ptr() == tu.data_ptr() and got[1].data_ptr() == tv.data_ptr()


@pytest.mark.parametrize("n", [70001, 300_007])
def test_dgc_select_out_of_range_count_changes_nothing_but_momentum(ops, n):
    """A count outside [low, high]: no selection returned, nothing cleared (the caller selects
    again), on one thread and several."""
    g, u, v = dgc_inputs(n, 80)
    for low, high in [(n, n), (0, 0), (5, 10)]:
        want = np_dgc_select(g, u, v, 0.9, False, 1, 9, 30, n // 50, low, high, True)
        got = ops.dgc_select(t(g), t(u), t(v), 0.9, False, 1, 9, 30, n // 50, low, high, True)
        assert_dgc_equal(got, want)
        assert got[2].numel() == 0 and (got[4] < low or got[4] > high)


def test_dgc_select_empty_and_full_selections(ops):
    n = 4099
    zeros = np.zeros(n, np.float32)
    # all zeros: threshold 0, every element selected; cap n takes them all, cap 0 none
    for cap in (n, 0, 17):
        want = np_dgc_select(zeros, zeros, zeros, 0.9, False, 0, 1, n, cap, 0, n, True)
        got = ops.dgc_select(t(zeros), t(zeros), t(zeros), 0.9, False, 0, 1, n, cap, 0, n, True)
        assert_dgc_equal(got, want)
        assert got[4] == n and got[2].numel() == cap
    # a NaN in the sample: threshold +inf, only the non-finite elements selected
    g, u, v = dgc_inputs(n, 90)
    want = np_dgc_select(g, u, v, 0.5, True, 11, 1, 1, n, 0, n, False)
    got = ops.dgc_select(t(g), t(u), t(v), 0.5, True, 11, 1, 1, n, 0, n, False)
    assert_dgc_equal(got, want)
    assert got[5] == np.inf and got[4] == 5  # g[5], g[6], g[11], g[29], u[31]


@pytest.mark.parametrize("shift", [(0, 0, 0), (1, 1, 0), (3, 2, 5), (0, 16, 0)])
@pytest.mark.parametrize("nesterov", [False, True])
def test_dgc_select_into_other_buffers_at_any_alignment(shift, nesterov):
    """TensorFlow's path: outputs other than u and v (streaming stores when equally aligned),
    inputs and outputs at any offset: the bits of the in-place call."""
    n = 200_003
    gb, ub, vb = (np.concatenate([np.zeros(8, np.float32), a]) for a in dgc_inputs(n + 8, 95))
    g, u, v = gb[shift[2]:shift[2] + n], ub[1:1 + n], vb[3:3 + n]
    want = np_dgc_select(g, u, v, 0.9, nesterov, 2, 99, 20, 2003, 0, n, False)
    u_buf, v_buf = np.full(n + 32, 7.0, np.float32), np.full(n + 32, 7.0, np.float32)
    u_out, v_out = u_buf[shift[0]:shift[0] + n], v_buf[shift[1]:shift[1] + n]
    u0, v0 = u.copy(), v.copy()
    got = native.dgc_select(g, u, v, 0.9, nesterov, 2, 99, 20, 2003, 0, n, False, u_out=u_out, v_out=v_out)
    assert got[0] is u_out and got[1] is v_out
    assert_dgc_equal(got, want)
    np.testing.assert_array_equal(u, u0)
    np.testing.assert_array_equal(v, v0)
    assert (u_buf[:shift[0]] == 7.0).all() and (u_buf[shift[0] + n:] == 7.0).all()
    assert (v_buf[:shift[1]] == 7.0).all() and (v_buf[shift[1] + n:] == 7.0).all()


ISA_DIGEST = """
import hashlib, sys, numpy as np
sys.path.insert(0, "tests")
from test_kernels import dgc_inputs
from hvdcompress.ops import native
h = hashlib.sha256()
for n, nesterov, masking, top, cap in [(1000, False, True, 4, 10), (70001, True, False, 4, 700),
                                      (333, False, False, 4, 333), (300_007, False, True, 3000, 5000)]:
    g, u, v = dgc_inputs(n, 7)
    for r in native.dgc_select(g, u, v, 0.9, nesterov, 0, 3, top, cap, 0, n, masking):
        h.update(np.asarray(r).tobytes())
for n in (1, 15, 17, 1000, 70001):  # the counter-hash and bfloat16 loops (HVDC_WIDE), bodies and tails
    x = dgc_inputs(n + 64, 8)[0][3:3 + n]
    x[x.size // 2:] *= 1e-30  # small magnitudes: natural's zero and subnormal codes
    outs = [native.levels_pack(x, 0.7, 8, True, 5), native.levels_pack(x, 11.0, 64, False, 6),
            native.ternary_pack(x, 0.6, 7), native.natural_pack(x, 8), native.half_cast(x, True),
            native.half_cast(x, False), native.unpack_sum(np.arange(2 * n, dtype=np.uint64).astype(np.uint8),
                                                          n, 8, np.linspace(-3, 3, 512).astype(np.float32)),
            native.bf16_sum(np.concatenate([native.half_cast(x, True)] * 3), n), native.l2_norm(x),
            native.fp16_sum((np.arange(n, dtype=np.int64) * 40503 % 65536).astype(np.uint16).view(np.int16), n),
            native.fp16_sum(np.concatenate([native.half_cast(x, False)] * 3), n),
            *native.sign_pack(x), *native.ef_sign_pack(x, x[::-1].copy()),
            native.sign_runs_sum(np.concatenate([native.sign_pack_runs(x, 77)[0]] * 3),
                                 np.concatenate([native.sign_pack_runs(x, 77)[1]] * 3), n, 77)]
    for r in outs:
        h.update(np.asarray(r).tobytes())
print(h.hexdigest())
"""


def test_the_kernels_compiled_per_instruction_set_agree():
    """dgc_select, the HVDC_WIDE loops (counter hash, bfloat16, 8-bit decode, l2 norm, signs, signs
    per run) and fp16_sum on
    AVX-512 on two threads, AVX2 on one and the baseline on two (HVDC_NO_AVX512 / HVDC_NO_AVX2
    turn them off): the same bits."""
    digests = set()
    for env in ({"OMP_NUM_THREADS": "2"}, {"HVDC_NO_AVX512": "1", "OMP_NUM_THREADS": "1"},
                {"HVDC_NO_AVX512": "1", "HVDC_NO_AVX2": "1", "OMP_NUM_THREADS": "2"}):
        out = subprocess.run([sys.executable, "-c", ISA_DIGEST], capture_output=True, text=True,
                             env={**os.environ, **env}, cwd=os.path.dirname(os.path.dirname(__file__)))
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize("params", [
    {"sparsity": 0.99, "min_numel": 0},
    {"sparsity": 0.95, "min_numel": 0, "nesterov": True, "momentum": 0.9},
    {"sparsity": 0.99, "min_numel": 0, "masking": True, "momentum": 0.9},
    {"sparsity": 0.99, "min_numel": 0, "upper": 1.01, "lower": 0.99, "resample": False,
     "max_adaptation_iters": 4, "momentum": 0.9},
    {"sparsity": 0.999, "min_numel": 0, "upper": 1.001, "lower": 0.999, "momentum": 0.9},
    {"sparsity": 0.9, "min_numel": 0, "sample_ratio": 1.0, "momentum": 0.5},
])
@pytest.mark.parametrize("n", [17, 1000, 300_000])
def test_dgc_fused_selection_is_the_operation_at_a_time_result(monkeypatch, params, n):
    """DGC with the fused kernel (the C++ path) and without: the same payloads and state, bit
    for bit, whether the pass's selection is kept or made again (adaptation, resampling)."""
    import hvdcompress as hc
    from hvdcompress.compressors import dgc as dgc_module
    from hvdcompress.contract.compressor import TensorInfo

    ops = TorchOps(kernels=True)

    def run(fused):
        monkeypatch.setattr(dgc_module, "FUSED", fused)
        comp, state, info, seen = hc.DGC(**params), {}, TensorInfo(name="w", numel=n, shape=(n,)), []
        for step in range(3):
            x = t(data(n, step, specials=True))
            if n > 10:
                x[7] = float("nan") if step == 1 else x[7]
            if step == 0:
                comp.init_state(ops, x, state, info)
            packet = comp.compress(ops, x, state, info)
            seen.append([a.clone() for a in packet.tensors] + [state["momentum"].clone(), state["velocity"].clone()])
        return seen

    for a, b in zip(run(True), run(False)):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x.view(torch.uint8).numpy(), y.view(torch.uint8).numpy())


# ---- PowerSGD products ------------------------------------------------------------------------
@pytest.mark.parametrize("rows,cols,r", [(1, 1, 1), (7, 3000, 2), (600, 50, 4), (3, 5000, 9)])
def test_lowrank_products_match_numpy(ops, rows, cols, r):
    rng = np.random.default_rng(rows * cols + r)
    e, g = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((cols, r)).astype(np.float32)
    m64 = e.astype(np.float64) + g
    te = t(e)
    m, p = ops.lowrank_project(te, t(g), t(q))
    np.testing.assert_array_equal(m.numpy(), e + g)  # M = e + g, exactly
    np.testing.assert_allclose(p.numpy(), m64 @ q, rtol=1e-4, atol=1e-4 * np.sqrt(cols))
    p_hat = np.linalg.qr(rng.standard_normal((rows, r)))[0][:, :r].astype(np.float32)
    p_hat = np.ascontiguousarray(np.pad(p_hat, ((0, 0), (0, r - p_hat.shape[1]))))
    back = ops.lowrank_project_back(m, t(p_hat)).numpy()
    np.testing.assert_allclose(back, m64.T @ p_hat, rtol=1e-4, atol=1e-4 * np.sqrt(rows))
    m[0, 0] = float("nan")
    res = ops.lowrank_residual(m, t(p_hat), t(back)).numpy()
    want = (m64 - p_hat.astype(np.float64) @ back.T.astype(np.float64)).reshape(-1)
    want[0] = 0.0  # non-finite entries are dropped
    assert res.shape == (rows * cols,)
    np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-5 * r)


def test_lowrank_shapes_are_checked():
    ops = TorchOps(kernels=True)
    with pytest.raises(ValueError, match="do not fit"):
        ops.lowrank_residual(torch.zeros(4, 5), torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="do not fit"):
        ops.lowrank_project_back(torch.zeros(4, 5), torch.zeros(3, 2))


@pytest.mark.parametrize("threshold", [0.5, 3.0])
def test_select_ge_over_several_threads_keeps_the_order(ops, threshold):
    x = data(1_000_003, 53)
    x[[7, 500_000, 999_999]] = np.nan
    selected = ~(np.abs(x) < threshold)
    values, indices = ops.select_ge(t(x), threshold)
    np.testing.assert_array_equal(indices.numpy(), np.nonzero(selected)[0])
    np.testing.assert_array_equal(values.numpy(), x[selected])


# ---- error feedback ---------------------------------------------------------------------------
@pytest.mark.parametrize("into", [None, "a", "b", "new"])
def test_sub_finite_matches_numpy(ops, into):
    a, b = data(70001, 60, specials=True), data(70001, 61)
    a[9] = np.nan
    b[10] = np.inf
    want = a - b
    want[~np.isfinite(want)] = 0.0
    ta, tb = t(a), t(b)
    out = {"a": ta, "b": tb, "new": torch.full((a.size,), 3.0), None: None}[into]
    got = ops.sub_finite(ta, tb, out=out)
    np.testing.assert_array_equal(got.numpy(), want)
    if out is not None:
        assert got.data_ptr() == out.data_ptr()


def test_fill_at_matches_numpy_and_checks_bounds(ops):
    x = data(70001, 62)
    idx = np.unique(np.random.default_rng(63).integers(0, x.size, 900))
    want = x.copy()
    want[idx] = 0.0
    tx = t(x)
    got = ops.fill_at(tx, t(idx), 0.0)
    np.testing.assert_array_equal(got.numpy(), want)
    assert got.data_ptr() == tx.data_ptr()
    before = tx.clone()
    with pytest.raises(IndexError, match="70001"):
        ops.fill_at(tx, t(np.array([5, 70001], np.int64)), 1.0)
    if ops.uses_kernels:  # the kernel checks every index before writing
        assert torch.equal(tx, before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # float64: the framework's own ops
def test_fill_at_non_finite_only_fills_only_nan_and_inf(ops, dtype):
    """DGC's momentum without masking: of the sent elements, only the non-finite are cleared."""
    x = data(70001, 64).astype(dtype)
    x[[3, 10, 20, 30]] = [np.nan, np.inf, -np.inf, -0.0]
    idx = np.array([3, 10, 20, 30, 40, 3, 50000], np.int64)  # a repeated index
    want = x.copy()
    want[[3, 10, 20]] = 0.0
    tx = t(x)
    got = ops.fill_at(tx, t(idx), 0.0, non_finite_only=True)
    np.testing.assert_array_equal(got.numpy(), want)
    assert got.data_ptr() == tx.data_ptr()


@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 2), (70001, 3)])
def test_bf16_sum_matches_numpy(ops, n, ranks):
    rng = np.random.default_rng(70 + n)
    bits = rng.integers(-2 ** 15, 2 ** 15, ranks * n).astype(np.int16)
    bits[0] = np.int16(-32768)  # -0.0
    values = (bits.astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    want = np.zeros(n, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # random patterns include inf and NaN
        for r in range(ranks):
            want = want + values[r * n:(r + 1) * n]
    got = ops.bf16_sum(t(bits), n).numpy()
    np.testing.assert_array_equal(got, want)  # NaN where a payload holds a NaN pattern, on both


def cast_inputs(n: int) -> np.ndarray:
    """Random bit patterns (NaN payloads of both signs, subnormals, infinities) then normal values
    over many octaves, with the edge cases of both formats at the front."""
    rng = np.random.default_rng(71)
    half = n // 2
    x = np.concatenate([rng.integers(0, 2 ** 32, half, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        (rng.standard_normal(n - half) * 10.0 ** rng.integers(-9, 6, n - half)).astype(np.float32)])
    edges = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA12345, 0x7F800000, 0xFF800000, 0, 0x80000000,
                      0x477FF000, 0x477FEFFF, 0xC77FF000, 0x33000000, 0x33000001, 0x387FF000, 0x00000001,
                      0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7F8000], np.uint32)  # ties, rounding to inf
    x[:edges.size] = edges.view(np.float32)
    return x


def np_fp16_bits(x: np.ndarray) -> np.ndarray:
    """numpy's binary16 cast (round to nearest even); NaN: sign | 0x7E00 | top 10 payload bits."""
    u = x.view(np.uint32)
    with np.errstate(over="ignore"):
        bits = x.astype(np.float16).view(np.uint16).copy()
    nan = np.isnan(x)
    bits[nan] = (((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF))[nan].astype(np.uint16)
    return bits


def np_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 by round to nearest even on the bits; NaN: 0xFFFF."""
    u = x.view(np.uint32).astype(np.uint64)
    bits = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0xFFFF), bits)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 70001])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_cast_matches_numpy_and_the_framework_cast(ops, dtype, n):
    x = cast_inputs(max(n, 40))[:n]  # small n: the edge cases, in the kernel's vector tail
    got = ops.half_cast(t(x), dtype)
    assert got.dtype == getattr(torch, dtype)
    bits = got.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits, (np_fp16_bits if dtype == "float16" else np_bf16_bits)(x))
    finite = ~np.isnan(x)  # torch's own cast: the same bits but for NaNs
    want = t(x).to(getattr(torch, dtype)).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits[finite], want[finite])


def test_half_cast_of_other_dtypes_is_the_framework_cast(ops):
    x = t(data(100).astype(np.float64))
    assert torch.equal(ops.half_cast(x, "float16"), x.to(torch.float16))
    h = x.to(torch.float16)
    assert ops.half_cast(h, "float16") is h


def np_fp16_values(bits: np.ndarray) -> np.ndarray:
    """numpy's float16 -> float32 (exact), NaNs made quiet (as F16C and torch's CPU cast)."""
    v = bits.view(np.float16).astype(np.float32)
    u = v.view(np.uint32)
    u[np.isnan(v)] |= np.uint32(0x400000)
    return v


def fp16_patterns(n: int, seed: int) -> np.ndarray:
    """n int16 binary16 patterns: every one of the 65536 (in a seeded order) as far as n goes,
    the special ones at the front (so that small n puts them in a vector tail)."""
    rng = np.random.default_rng(seed)
    every = rng.permutation(65536).astype(np.uint16)
    bits = np.resize(every, n)
    edges = np.array([0x7C01, 0xFC01, 0x7E00, 0xFE00, 0x7D55, 0x7FFF, 0x7C00, 0xFC00, 0x8000, 0x0000,
                      0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x0200], np.uint16)
    m = min(n, edges.size)
    bits[:m] = edges[:m]
    return bits.view(np.int16)


@pytest.mark.parametrize("n,ranks", [(1, 1), (7, 1), (8, 2), (9, 1), (15, 3), (16, 1), (17, 2), (19, 1),
                                     (2048 + 33, 2), (65536, 1), (70001, 3)])
def test_fp16_sum_matches_numpy(ops, n, ranks):
    """The exact float32 of every binary16 pattern (subnormals, infinities, NaN payloads), summed
    over ranks in rank order from the first payload (-0.0 kept), on vector bodies and tails."""
    bits = np.concatenate([fp16_patterns(n, 80 + r) for r in range(ranks)])
    values = np_fp16_values(bits)
    want = values[:n].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(1, ranks):
            want = want + values[r * n:(r + 1) * n]
    got = ops.fp16_sum(t(bits), n).numpy()
    np.testing.assert_array_equal(got, want)
    # the bits, NaN payloads too, but where two payloads hold NaNs (which one the sum keeps
    # depends on the compiler's operand order)
    one = np.isnan(values.reshape(ranks, n)).sum(axis=0) < 2
    np.testing.assert_array_equal(got.view(np.uint32)[one], want.view(np.uint32)[one])
    if ranks == 1:  # torch's own cast: the same bits but for NaNs (its NaN bits vary with the size)
        cast = t(bits).view(torch.float16).float().numpy()
        np.testing.assert_array_equal(cast, got)
        finite = ~np.isnan(got)
        np.testing.assert_array_equal(got.view(np.uint32)[finite], cast.view(np.uint32)[finite])


@pytest.mark.parametrize("grad_dtype", ["float32", "float16", "float64", "bfloat16"])
def test_fp16_decodes_to_the_bits_of_the_framework_cast(ops, grad_dtype):
    """FP16's decompress (through fp16_sum for non-float16 gradients) gives what casting the
    payload did, into a new tensor or a caller's buffer; decompress_gathered the sum of the
    payloads decoded one by one. The payloads: finite patterns (NaN bits from a cast vary)."""
    import hvdcompress as hc
    from hvdcompress.contract.compressor import Compressor, TensorInfo
    n, world = 5000, 3
    comp, info = hc.FP16(), TensorInfo(name="w", numel=n, shape=(n,))
    finite = [p[(p.view(np.uint16) & 0x7C00) != 0x7C00][:n] for p in (fp16_patterns(4 * n, 90 + r) for r in range(world))]
    payloads = [t(p).view(torch.float16) for p in finite]
    want = payloads[0].to(getattr(torch, grad_dtype))
    got = comp.decompress(ops, [payloads[0]], grad_dtype, info)
    assert got.dtype == want.dtype and got.shape == (n,)
    assert torch.equal(got.view(-1).view(torch.uint8), want.view(torch.uint8))
    for out_dtype in (torch.float32, torch.float64):
        out = torch.full((n,), 7.0, dtype=out_dtype)
        assert comp.decompress(ops, [payloads[0]], grad_dtype, info, out=out) is out
        assert torch.equal(out.view(torch.uint8), payloads[0].to(out_dtype).view(torch.uint8))
    gathered = torch.cat(payloads)
    want = Compressor.decompress_gathered(comp, ops, [gathered], grad_dtype, info, world)
    got = comp.decompress_gathered(ops, [gathered], grad_dtype, info, world)
    assert got.dtype == want.dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_bf16_sum_rejects_bad_payloads(ops):
    with pytest.raises(TypeError, match="int16"):
        ops.bf16_sum(torch.zeros(10, dtype=torch.int32), 5)
    with pytest.raises(ValueError, match="bits has 10 elements, not a positive multiple of 4"):
        ops.bf16_sum(torch.zeros(10, dtype=torch.int16), 4)


def test_kernel_outputs_reuse_a_buffer_only_once_nothing_holds_it():
    """Large outputs come from a recycling pool: a buffer a tensor still wraps is never handed out
    again, one that nothing references is (so results never alias live tensors)."""
    from hvdcompress.ops import native
    ops = TorchOps(kernels=True)
    n = (1 << 20) + 12345  # a size no other test uses: the pool holds no free buffer of it
    x = t(data(n, 70))
    first = ops.natural_pack(x, 1)  # an output of n bytes
    want = first.numpy().copy()
    second = ops.natural_pack(x, 2)
    assert second.data_ptr() != first.data_ptr()
    np.testing.assert_array_equal(first.numpy(), want)  # not overwritten by the second call
    address = first.data_ptr()
    del first
    again = native.empty(n, np.uint8)
    assert again.ctypes.data == address


@pytest.mark.parametrize("shift", [0, 1, 3])
def test_large_decodes_stream_into_any_output_alignment(shift):
    """unpack_sum, bf16_sum and fp16_sum take streaming stores into outputs of 2^20 floats or more (from
    an L1 block), sparse_sum's zero fill too: the bits of the numpy sums, into an output at any
    float offset, nothing written outside it."""
    n, R = 1_100_003, 2
    rng = np.random.default_rng(96)
    codes = rng.integers(0, 256, R * n).astype(np.uint8)
    tables = rng.standard_normal(256 * R).astype(np.float32)
    tables[[0, 257]] = -0.0
    bits = native.half_cast(rng.standard_normal(R * n).astype(np.float32), True)
    want_codes = np.float32(0.0) + tables[codes[:n]] + tables[256 + codes[n:]]
    b = bits.view(np.uint16).astype(np.uint32) << 16
    want_bits = np.float32(0.0) + b[:n].view(np.float32) + b[n:].view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # the bfloat16 patterns read as binary16
        want_fp16 = np_fp16_values(bits[:n]) + np_fp16_values(bits[n:])
    idx = np.sort(rng.choice(n, n // 100, replace=False)).astype(np.int64)
    idx[:3] = [0, 0, n - 1]  # repeats sum in order, and both ends
    vals = rng.standard_normal(idx.size).astype(np.float32)
    want_sparse = np.zeros(n, np.float32)
    np.add.at(want_sparse, idx, vals)
    for got, want in [(lambda out: native.unpack_sum(codes, n, 8, tables, out=out), want_codes),
                      (lambda out: native.bf16_sum(bits, n, out=out), want_bits),
                      (lambda out: native.fp16_sum(bits, n, out=out), want_fp16),
                      (lambda out: native.sparse_sum(n, idx, vals, out=out), want_sparse)]:
        buf = np.full(n + 8, 7.0, np.float32)
        out = buf[shift:shift + n]
        assert got(out) is out
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        assert (buf[:shift] == 7.0).all() and (buf[shift + n:] == 7.0).all()
