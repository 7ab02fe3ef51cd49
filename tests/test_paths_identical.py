"""Every path through the kernels gives the same bits: the torch C++-kernel path, the plain-torch
fallback and TensorFlow (which runs the same C++ kernels).

Every registered compressor runs a simulated 2-rank, 3-step exchange (summable payloads summed,
the others concatenated as allgather does) on each path with the same gradients and fixed
seeds/keys. The payload of every rank and round, the decoded sum and the final per-rank state
must be bit-identical to the torch kernel path's. Exceptions, where a framework op (not a kernel)
does a float reduction: PowerSGD, equal to a relative 1e-5 (its orthonormalisation is each
framework's own QR, its products are BLAS's on the fallback); and CSC on TensorFlow, to 1e-6 (its
chunk L1 norms are a framework matrix-vector product, summed in TensorFlow's own order).

A path whose framework or kernel library is missing is skipped (the Keras 3 environment has no
torch: there nothing is compared).
"""
from __future__ import annotations

import numpy as np
import pytest

import hvdcompress
from hvdcompress import TensorInfo, from_params

torch = pytest.importorskip("torch")
from hvdcompress.ops.torch_ops import TorchOps  # noqa: E402

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
    # tight bounds: the threshold adaptation runs (a host loop on C++, a device loop elsewhere)
    {"compressor": "dgc", "sparsity": "0.99", "min_numel": "0", "upper": "1.01", "lower": "0.99",
     "resample": "false", "max_adaptation_iters": "4"},
    {"compressor": "csc", "ratio": "0.1", "chunk": "64", "min_numel": "0"},
    {"compressor": "csc", "ratio": "0.05", "chunk": "100", "min_numel": "0", "momentum": "nesterov"},
    {"compressor": "csc"},  # below min_numel: dense
    {"compressor": "threshold", "threshold": "0.1"},
    {"compressor": "onebit"},
    {"compressor": "onebit", "ef": "vanilla"},
    {"compressor": "onebit", "ef": "vanilla", "chunk": "rows"},
    {"compressor": "onebit", "chunk": "100"},
    {"compressor": "efsignsgd"},
    {"compressor": "signum"},
    {"compressor": "twobit", "threshold": "0.05"},
    {"compressor": "int8"},
    {"compressor": "powersgd", "rank": "2"},
    {"compressor": "dithering", "seed": "1"},
    {"compressor": "dithering", "seed": "5", "partition": "linear", "norm": "l2", "levels": "5"},
    {"compressor": "qsgd", "seed": "2"},
    {"compressor": "terngrad", "seed": "3"},
    {"compressor": "natural", "seed": "4"},
]
N, ROWS, WORLD, STEPS = 3000, 60, 2, 3
RTOL = {"powersgd": {"torch-fallback": 1e-5, "tensorflow": 1e-5}, "csc": {"tensorflow": 1e-6}}


def tensorflow_ops():
    tf_backend = pytest.importorskip("hvdcompress.ops.tf_ops")
    try:
        tf_backend.kernels()
    except ImportError as exc:
        pytest.skip(f"TensorFlow needs the C++ kernel library: {exc}")
    return tf_backend.TFOps()


def gradients() -> list:
    """[step][rank] float32 gradients: a spread of magnitudes, ties, zeros of both signs."""
    rng = np.random.default_rng(7)
    steps = []
    for _ in range(STEPS):
        ranks = []
        for _ in range(WORLD):
            g = (rng.standard_normal(N) * 0.1).astype(np.float32)
            g[[10, 11, 12, 13]] = [0.0, -0.0, g[20], -g[20]]
            ranks.append(g)
        steps.append(ranks)
    return steps


def to_numpy(t) -> np.ndarray:
    if isinstance(t, (int, float)):
        return np.asarray(t)
    if isinstance(t, torch.Tensor):
        return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy().copy()
    import tensorflow as tf
    t = tf.convert_to_tensor(t)
    return tf.cast(t, tf.float32).numpy() if t.dtype == tf.bfloat16 else t.numpy()


def simulate(ops, spec: dict) -> dict:
    """Every payload, decoded sum and final state of a simulated exchange on ``ops``, by name."""
    compressor = from_params(spec)
    if ops.name == "tensorflow":
        import tensorflow as tf

        from hvdcompress.tensorflow.state import VariableState
        states, like = [VariableState(f"rank{r}") for r in range(WORLD)], tf.zeros([1])
    else:
        states, like = [{} for _ in range(WORLD)], torch.zeros(1)
    record = {}
    for step, grads in enumerate(gradients()):
        info = TensorInfo(name="layer.weight", numel=N, world=WORLD, shape=(ROWS, N // ROWS),
                          momentum=0.9 if compressor.takes_over_momentum else 0.0)
        packets = []
        for r in range(WORLD):
            x = ops.from_numpy(grads[r], like)
            compressor.init_state(ops, x, states[r], info)
            packets.append(compressor.compress(ops, x, states[r], info))
        for rnd in range(10):
            for r, p in enumerate(packets):
                for i, t in enumerate(p.tensors):
                    record[f"step {step} round {rnd} rank {r} payload {i}"] = to_numpy(t)
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
        record[f"step {step} decoded"] = to_numpy(total)
    for r, state in enumerate(states):
        for key, value in state.items():
            record[f"rank {r} state {key}"] = to_numpy(value)
    return record


def test_every_registered_compressor_is_compared():
    assert sorted({s["compressor"] for s in SPECS}) == hvdcompress.available()


@pytest.mark.parametrize("path", ["torch-fallback", "tensorflow"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s.values())))
def test_path_gives_the_torch_kernels_bits(spec, path):
    ops = TorchOps(kernels=False) if path == "torch-fallback" else tensorflow_ops()
    want = simulate(TorchOps(kernels=True), spec)
    got = simulate(ops, spec)
    assert sorted(got) == sorted(want), "payloads, rounds or state keys differ"
    for name, b in want.items():
        a = got[name]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{name}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        rtol = RTOL.get(spec["compressor"], {}).get(path)
        if rtol is not None and a.dtype.kind == "f":
            scale = float(np.nanmax(np.abs(b))) if b.size else 0.0  # atol relative to the largest
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=name)
        else:
            assert np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)), \
                f"{name}: {np.count_nonzero(a != b)} of {a.size} elements differ"


def test_the_comparison_can_fail():
    """A different seed changes the stochastic codes: the comparison above would notice."""
    a = simulate(TorchOps(kernels=True), {"compressor": "natural", "seed": "4"})
    b = simulate(TorchOps(kernels=False), {"compressor": "natural", "seed": "5"})
    assert not np.array_equal(a["step 0 round 0 rank 0 payload 0"], b["step 0 round 0 rank 0 payload 0"])
