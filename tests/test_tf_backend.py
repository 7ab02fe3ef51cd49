"""TFOps: the kernels on TensorFlow tensors against numpy references, and TensorFlow state.

TFOps runs the same C++ kernels as the torch path (through hvdcompress.ops.native); that both
frameworks give the same bits for every compressor is tests/test_paths_identical.py's job. These
tests run in the Keras 3 environment too (make test-keras3), which has no torch.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvdcompress.tensorflow import TFOps
from hvdcompress.tensorflow.state import VariableState

TF = TFOps()


# ---- kernels against numpy ------------------------------------------------------------------
def special_vector() -> np.ndarray:
    x = np.random.default_rng(3).standard_normal(1001).astype(np.float32)
    x[[5, 6, 7, 8, 9, 10]] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-42]
    x[20:24] = x[30]  # ties
    return x


def test_sign_pack_matches_numpy_packbits():
    x = special_vector()
    packed, mean = TF.sign_pack(tf.constant(x))
    np.testing.assert_array_equal(packed.numpy(), np.packbits(~np.signbit(x)))
    assert np.isnan(mean.numpy()[0])  # x holds a NaN
    finite = np.nan_to_num(x, nan=1.0, posinf=1.0, neginf=-1.0)
    _, mean = TF.sign_pack(tf.constant(finite))
    assert mean.numpy()[0] == np.float32(np.abs(finite.astype(np.float64)).mean())


def test_twobit_pack_with_residual_matches_numpy():
    x = special_vector()
    residual = np.random.default_rng(4).standard_normal(x.size).astype(np.float32) * 0.1
    t = np.float32(0.5)
    packed, new_residual = TF.twobit_pack(tf.constant(x), float(t), tf.constant(residual))
    v = x + residual
    codes = np.where(v >= t, 3, 0) + np.where(v <= -t, 2, 0) + np.isnan(v)
    bits = np.stack([(codes >> 1) & 1, codes & 1], 1).ravel()
    np.testing.assert_array_equal(packed.numpy(), np.packbits(bits))
    expected = v - t * ((v >= t).astype(np.float32) - (v <= -t).astype(np.float32))
    expected[~np.isfinite(expected)] = 0
    np.testing.assert_array_equal(new_residual.numpy(), expected)
    table = np.array([0, np.nan, -t, t], np.float32)
    decoded = TF.unpack_sum(packed, x.size, 2, tf.constant(np.concatenate([table])))
    np.testing.assert_array_equal(decoded.numpy(), table[codes])


def test_topk_abs_and_select_ge_match_numpy():
    x = special_vector()
    values, indices = TF.topk_abs(tf.constant(x), 50)
    key = np.abs(x).astype(np.float64)
    key[np.isnan(x)] = np.inf * 2  # NaN ranks above +inf
    order = sorted(range(x.size), key=lambda i: (-(np.inf if np.isnan(x[i]) else 0), -key[i], i))
    expected = np.sort(np.array(order[:50]))
    np.testing.assert_array_equal(indices.numpy(), expected)
    np.testing.assert_array_equal(values.numpy(), x[expected])
    values, indices = TF.select_ge(tf.constant(x), 1.5)
    expected = np.nonzero(~(np.abs(x) < 1.5))[0]
    np.testing.assert_array_equal(indices.numpy(), expected)
    assert TF.count_ge(tf.constant(x), 1.5) == expected.size


def test_minmax_round_trip_within_one_level():
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    codes, bounds = TF.minmax_pack(tf.constant(x), 256)
    assert codes.dtype == tf.uint8 and bounds.shape == (2 * 4,)
    back = TF.minmax_unpack_sum(codes, bounds, x.size, 256).numpy()
    spans = [x[i:i + 256].max() - x[i:i + 256].min() for i in range(0, 1000, 256)]
    assert all(np.abs(back[i:i + 256] - x[i:i + 256]).max() <= spans[i // 256] / 255 / 2 * 1.001
               for i in range(0, 1000, 256))


@pytest.mark.parametrize("n, run", [(1000, 64), (64, 64), (5, 1), (7, 10)])
def test_sign_runs_match_numpy(n, run):
    """OneBit's per-run scales on TensorFlow tensors: the mean |x| of each run (the last one
    shorter), and two payloads decoded, +-their run's scale, summed in rank order."""
    xs = [np.random.default_rng(6 + r).standard_normal(n).astype(np.float32) for r in range(2)]
    payloads = [TF.sign_pack_runs(tf.constant(x), run) for x in xs]
    for x, (packed, means) in zip(xs, payloads):
        np.testing.assert_array_equal(packed.numpy(), np.packbits(~np.signbit(x)))
        np.testing.assert_array_equal(means.numpy(), np.array(
            [np.abs(x[i:i + run]).astype(np.float64).mean() for i in range(0, n, run)], np.float32))
    want = np.zeros(n, np.float32)
    for x, (_, means) in zip(xs, payloads):
        scale = np.repeat(means.numpy(), run)[:n]
        want = want + np.where(np.signbit(x), -scale, scale)
    got = TF.sign_runs_sum(tf.concat([p for p, _ in payloads], 0), tf.concat([m for _, m in payloads], 0), n, run)
    np.testing.assert_array_equal(got.numpy(), want)


def test_stochastic_levels_are_unbiased():
    x = np.full(20000, 0.3, np.float32)
    codes = TF.levels_pack(tf.constant(x), 1.0, 1, False, key=11)  # levels 0 or 1, P(1) = 0.3
    level = codes.numpy().view(np.int8).astype(np.float64)
    assert abs(level.mean() - 0.3) < 0.01


def test_sparse_sum_adds_repeats_and_rejects_out_of_range():
    out = TF.sparse_sum(5, tf.constant([1, 3, 1], tf.int32), tf.constant([1.0, 2.0, 4.0]))
    np.testing.assert_array_equal(out.numpy(), np.array([0, 5, 0, 2, 0], np.float32))
    with pytest.raises(IndexError, match="index 9 at position 1 is outside"):
        TF.sparse_sum(5, tf.constant([1, 9], tf.int64), tf.constant([1.0, 2.0]))


def test_kernels_reject_wrong_dtype_and_rank():
    with pytest.raises(TypeError, match="x must be a float32 tensor, got float64"):
        TF.sign_pack(tf.zeros([4], tf.float64))
    with pytest.raises(ValueError, match="x must be a contiguous 1-D tensor, got a 2-D tensor"):
        TF.sign_pack(tf.zeros([2, 2]))
    with pytest.raises(ValueError, match="levels=0 is out of range; allowed: 1..127"):
        TF.levels_pack(tf.zeros([4]), 1.0, 0, False, 1)


def test_variable_state_keeps_tensors_and_python_numbers_in_variables():
    state = VariableState("w")
    TF.write(state, "residual", tf.constant([1.0, 2.0]))
    first = state.slots["residual"]
    TF.write(state, "residual", tf.constant([3.0, 4.0]))
    assert state.slots["residual"] is first  # assigned in place, not replaced
    np.testing.assert_array_equal(state["residual"].numpy(), [3.0, 4.0])
    state.setdefault("step", 0)
    state["step"] = state["step"] + 1
    assert state["step"] == 1 and isinstance(state["step"], int)
    assert isinstance(state.slots["step"], tf.Variable) and len(state) == 2


def test_state_updates_return_new_tensors_and_leave_their_inputs_unchanged():
    """The kernels see TensorFlow tensors as zero-copy views: on TF (not in place) they must write
    only into new buffers, whatever the result size (DLPack above 4096 elements)."""
    rng = np.random.default_rng(8)
    x, r, g, u, v = (rng.standard_normal(5000).astype(np.float32) for _ in range(5))
    tensors = [tf.constant(a) for a in (x, r, g, u, v)]
    tx, tr, tg, tu, tv = tensors
    _, scale, new_r = TF.ef_sign_pack(tx, tr)
    p = x + r
    s = np.float32(np.abs(p.astype(np.float64)).sum() / p.size)
    assert scale.numpy()[0] == s
    np.testing.assert_array_equal(new_r.numpy(), p - np.where(np.signbit(p), -s, s))
    _, new_r = TF.twobit_pack(tx, 0.5, tr)
    t = np.float32(0.5)
    np.testing.assert_array_equal(new_r.numpy(), p - t * ((p >= t).astype(np.float32) - (p <= -t).astype(np.float32)))
    new_u, new_v = TF.momentum_correction(tu, tv, tg, 0.9, False)
    np.testing.assert_array_equal(new_u.numpy(), u * np.float32(0.9) + g)
    np.testing.assert_array_equal(new_v.numpy(), v + (u * np.float32(0.9) + g))
    filled = TF.fill_at(tx, tf.constant([3, 4999], tf.int64), 0.0)
    want = x.copy()
    want[[3, 4999]] = 0.0
    np.testing.assert_array_equal(filled.numpy(), want)
    for tensor, original in zip(tensors, (x, r, g, u, v)):
        np.testing.assert_array_equal(tensor.numpy(), original)


def test_fill_at_fills_an_owned_kernel_result_in_its_buffer_and_copies_anything_else():
    """``owned``: the caller's fresh kernel result (DGC's new momentum and velocity) is filled in
    the buffer it wraps, without a copy; a tensor that is not a kernel result is copied."""
    n, where = 8192, tf.constant([1, 5000], tf.int64)
    g = np.random.default_rng(8).standard_normal(n).astype(np.float32)
    _, v = TF.momentum_correction(TF.zeros(n, like=tf.constant(g)), TF.zeros(n, like=tf.constant(g)),
                                  tf.constant(g), 0.9, False)
    address = np.asarray(v).ctypes.data
    filled = TF.fill_at(v, where, 0.0, owned=True)
    want = g.copy()
    want[[1, 5000]] = 0.0
    assert filled is v and np.asarray(filled).ctypes.data == address
    np.testing.assert_array_equal(filled.numpy(), want)
    constant = tf.constant(g)
    filled = TF.fill_at(constant, where, 0.0, owned=True)
    np.testing.assert_array_equal(filled.numpy(), want)
    np.testing.assert_array_equal(constant.numpy(), g)


def test_decoders_fill_a_variable_out():
    bits = np.arange(16) % 3 == 0
    out = tf.Variable(tf.fill([16], 7.0))
    got = TF.sign_vote(tf.constant(np.packbits(bits)), 16, 2.0, out=out)
    assert got is out
    np.testing.assert_array_equal(out.numpy(), np.where(bits, 2.0, -2.0).astype(np.float32))


def test_l2_norm_matches_numpy_in_float64():
    x = np.random.default_rng(9).standard_normal(100003).astype(np.float32)
    want = np.float32(np.sqrt((x.astype(np.float64) ** 2).sum()))
    assert TF.norm(tf.constant(x)).numpy() == want


@pytest.mark.parametrize("n,masking", [(1000, False), (200_003, True)])
def test_dgc_select_writes_new_tensors_and_leaves_its_inputs(n, masking):
    """DGC's fused pass on immutable tensors: new u and v (streaming stores at 200K), the
    selection of the numpy reference, u, v and g unchanged."""
    rng = np.random.default_rng(10)
    g, u, v = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    g[[3, 7]] = [np.nan, np.inf]
    tg, tu, tv = (tf.constant(a) for a in (g, u, v))
    top, cap = max(1, n // 300), n // 100
    new_u, new_v, values, indices, count, threshold = TF.dgc_select(tg, tu, tv, 0.9, False, 1, 3, top, cap,
                                                                     0, n, masking)
    mu = np.float32(0.9)
    want_u, want_v = u * mu + g, v + (u * mu + g)
    keys = np.sort(want_v.view(np.uint32)[1::3] & np.uint32(0x7FFFFFFF))[::-1]
    t = np.array([keys[top - 1]], np.uint32).view(np.float32)[0]
    with np.errstate(invalid="ignore"):
        selected = np.nonzero(~(np.abs(want_v) < t))[0]
    assert threshold == t and count == selected.size
    kept = selected[:cap]
    np.testing.assert_array_equal(indices.numpy(), kept)
    np.testing.assert_array_equal(values.numpy(), want_v[kept])
    want_v[kept] = 0.0
    want_u[kept if masking else kept[~np.isfinite(want_u[kept])]] = 0.0
    np.testing.assert_array_equal(new_u.numpy(), want_u)
    np.testing.assert_array_equal(new_v.numpy(), want_v)
    for tensor, original in zip((tg, tu, tv), (g, u, v)):
        np.testing.assert_array_equal(tensor.numpy(), original)
