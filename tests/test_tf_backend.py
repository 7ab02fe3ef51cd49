"""TFOps: kernels against numpy, and the TensorFlow path against the torch path.

Same gradient in, same decompressed gradient out: every registered compressor runs a simulated
2-rank, 3-step exchange (summable payloads summed, the others concatenated as allgather does)
once on TFOps and once on TorchOps; the results and the per-rank state must be bit-identical.
Exceptions, compared to a relative 1e-6 instead: compressors whose output scales with a float
reduction (mean |x| for onebit / EF-signSGD, the L2 norm for QSGD and DGC's clipping), whose
summation order is each implementation's own (the C++ kernels sum SIMD lanes per block); and
PowerSGD, to 1e-4, as the QR factorisations differ. The stochastic compressors match too when
torch runs the C++ kernels, whose uniforms the TensorFlow kernels reproduce.

The torch comparison needs torch, which the Keras 3 environment (make test-keras3) does not have:
there it is skipped by the ``needs_torch`` marker; the numpy checks still run.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdcompress
from hvdcompress import TensorInfo, from_params
from hvdcompress.tensorflow import TFOps
from hvdcompress.tensorflow.state import VariableState

try:
    import torch
    from hvdcompress.torch.backend import TorchOps
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Keras 3 "
                                 "environment): cross-framework comparison skipped")
TF = TFOps()

SPECS = [
    {"compressor": "none"},
    {"compressor": "fp16"},
    {"compressor": "bf16"},
    {"compressor": "topk", "k": "0.01"},
    {"compressor": "topk", "k": "37", "ef": "vanilla"},
    {"compressor": "topk", "k": "0.05", "ef": "vanilla", "momentum": "nesterov", "momentum_mu": "0.9"},
    {"compressor": "randomk", "k": "0.05", "seed": "3", "ef": "vanilla"},
    {"compressor": "randomk", "k": "0.05", "scale": "true"},
    {"compressor": "dgc", "sparsity": "0.99", "min_numel": "0"},
    {"compressor": "dgc", "sparsity": "0.95", "min_numel": "0", "momentum": "nesterov"},
    {"compressor": "dgc", "sparsity": "0.99", "min_numel": "0", "fp16_values": "true",
     "resample": "false", "clip_norm": "1.0"},
    {"compressor": "dgc", "sparsity": "0.99"},  # below min_numel: dense
    {"compressor": "csc", "ratio": "0.1", "chunk": "64", "min_numel": "0"},
    {"compressor": "csc", "ratio": "0.05", "chunk": "100", "min_numel": "0", "momentum": "nesterov"},
    {"compressor": "csc"},  # below min_numel: dense
    {"compressor": "threshold", "threshold": "0.1"},
    {"compressor": "onebit"},
    {"compressor": "efsignsgd"},
    {"compressor": "signum"},
    {"compressor": "twobit", "threshold": "0.05"},
    {"compressor": "int8"},
    {"compressor": "powersgd", "rank": "2"},
    {"compressor": "dithering", "seed": "1"},
    {"compressor": "qsgd", "seed": "2"},
    {"compressor": "terngrad", "seed": "3"},
    {"compressor": "natural", "seed": "4"},
]
STOCHASTIC = {"dithering", "qsgd", "terngrad", "natural"}
REDUCTION_SCALED = {"onebit", "efsignsgd", "qsgd"}
N, WORLD, STEPS = 3000, 2, 3


def gradients() -> list:
    """[step][rank] float32 gradients, with a NaN-free spread of magnitudes."""
    rng = np.random.default_rng(7)
    return [[(rng.standard_normal(N) * 0.1).astype(np.float32) for _ in range(WORLD)]
            for _ in range(STEPS)]


def to_numpy(t) -> np.ndarray:
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    t = tf.convert_to_tensor(t)
    return tf.cast(t, tf.float32).numpy() if t.dtype == tf.bfloat16 else t.numpy()


def simulate(ops, spec: dict) -> tuple:
    """Outputs per step and final per-rank states of a simulated exchange on ``ops``."""
    compressor = from_params(spec)
    states = [{} if ops is not TF else VariableState(f"rank{r}") for r in range(WORLD)]
    like = tf.zeros([1]) if ops is TF else torch.zeros(1)
    outputs = []
    for step in gradients():
        info = TensorInfo(name="layer.weight", numel=N, world=WORLD, shape=(60, 50),
                          momentum=0.9 if compressor.takes_over_momentum else 0.0)
        packets = []
        for r in range(WORLD):
            x = ops.from_numpy(step[r], like)
            compressor.init_state(ops, x, states[r], info)
            packets.append(compressor.compress(ops, x, states[r], info))
        while True:
            combine = (lambda ts: ts[0] + ts[1]) if packets[0].summable else ops.concat
            wire = [combine([p.tensors[i] for p in packets]) for i in range(len(packets[0].tensors))]
            if packets[0].resume is None:
                break
            packets = [p.resume(wire) for p in packets]
        if packets[0].summable:
            total = compressor.decompress(ops, wire, packets[0].ctx, info)
        else:
            total = compressor.decompress_gathered(ops, wire, packets[0].ctx, info, WORLD)
        compressor.on_step()
        outputs.append(to_numpy(total))
    final = [{k: to_numpy(v) if not isinstance(v, (int, float)) else v for k, v in s.items()}
             for s in states]
    return outputs, final


def test_every_registered_compressor_is_compared():
    assert sorted({s["compressor"] for s in SPECS}) == hvdcompress.available()


@needs_torch
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s.values())))
def test_same_gradient_in_same_decompressed_gradient_out_as_torch(spec):
    torch_ops = TorchOps()
    if spec["compressor"] in STOCHASTIC and not torch_ops.uses_kernels:
        pytest.skip("torch's fallback draws its own uniforms; only the C++ kernels share TF's")
    tf_out, tf_state = simulate(TF, spec)
    torch_out, torch_state = simulate(torch_ops, spec)
    if spec["compressor"] == "powersgd":
        rtol, atol = 1e-4, 1e-4
    elif spec["compressor"] in REDUCTION_SCALED or "clip_norm" in spec:
        rtol, atol = 1e-6, 1e-6  # atol relative to the largest value: ranks' scales cancel
    else:
        rtol = atol = None  # bit-exact
    for step, (a, b) in enumerate(zip(tf_out, torch_out)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_same(a, b, rtol, atol, f"step {step}")
    for r, (a, b) in enumerate(zip(tf_state, torch_state)):
        assert sorted(a) == sorted(b), f"rank {r}: state keys differ"
        for key in a:
            assert_same(np.asarray(a[key]), np.asarray(b[key]), rtol, atol, f"rank {r} {key}")


def assert_same(a: np.ndarray, b: np.ndarray, rtol, atol, where: str) -> None:
    """Bit-identical when ``rtol`` is None, else close (``atol`` relative to max |b|)."""
    if rtol is None:
        assert np.array_equal(a, b, equal_nan=True), f"{where}: max diff {np.nanmax(np.abs(a - b))}"
    else:
        scale = float(np.nanmax(np.abs(b))) if b.size else 0.0
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale, err_msg=where)


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
    with pytest.raises(ValueError, match="x must be a 1-D tensor"):
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
