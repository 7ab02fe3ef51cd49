"""The quantisers, threshold and PowerSGD in hvdcompress.torch.DistributedOptimizer under real
Horovod processes (horovodrun --gloo), on both kernel paths."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_scripts

pytestmark = pytest.mark.horovod
N = 1000
KERNEL_ENV = {"kernels": {"HVDCOMPRESS_DISABLE_KERNELS": "0"},
              "fallback": {"HVDCOMPRESS_DISABLE_KERNELS": "1"}}
SPECS = [
    {"compressor": "onebit", "ef": "vanilla"},
    {"compressor": "efsignsgd"},
    {"compressor": "signum", "momentum": "plain"},
    {"compressor": "threshold", "threshold": "0.05", "ef": "vanilla"},
    {"compressor": "twobit", "threshold": "0.005"},
    {"compressor": "int8", "chunk": "256"},
    {"compressor": "dithering", "levels": "8", "seed": "1"},
    {"compressor": "qsgd", "levels": "16", "seed": "2", "momentum": "nesterov"},
    {"compressor": "terngrad", "seed": "3"},
    {"compressor": "natural", "seed": "4"},
    {"compressor": "powersgd", "rank": "2"},
]


def rank_vector(rank: int, n: int = N, seed: int = 100) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


@pytest.fixture(scope="module")
def launch() -> dict:
    """One launch: training and the aggregation cases, on the C++ kernels then the fallback."""
    return run_scripts([(f"{script}.{path}", script, args, env) for path, env in KERNEL_ENV.items()
                        for script, args in (("torch_identical", [json.dumps(SPECS)]),
                                             ("torch_quant_aggregate", []))])


@pytest.mark.parametrize("path", ["kernels", "fallback"])
def test_every_rank_ends_with_identical_parameters(launch, path):
    results = launch[f"torch_identical.{path}"]
    assert len(results) == 2 * len(SPECS)
    assert all(r["kernels"] == (path == "kernels") for r in results)
    for spec in SPECS:
        runs = [r for r in results if r["spec"] == spec]
        assert len(runs) == 2
        assert runs[0]["params"] == runs[1]["params"], spec
        assert runs[0]["moved"] > 1e-4, f"{spec} did not train"
        assert runs[0]["sent"] < runs[0]["dense"] / 3, spec


def np_int8(x: np.ndarray, chunk: int) -> np.ndarray:
    out = np.empty_like(x)
    for c in range(0, x.size, chunk):
        v = x[c:c + chunk]
        mn, mx = v.min(), v.max()
        span = np.float32(mx - mn)
        q = np.clip(np.rint((v - mn) * (np.float32(255) / span)), 0, 255).astype(np.float32)
        out[c:c + chunk] = mn + q * (span / np.float32(255))
    return out


def signs(x: np.ndarray) -> np.ndarray:
    return np.where(np.signbit(x), np.float32(-1), np.float32(1))


@pytest.mark.parametrize("path", ["kernels", "fallback"])
def test_aggregated_gradients_equal_hand_computed_ones(launch, path):
    world = 2
    results = launch[f"torch_quant_aggregate.{path}"]
    assert results and all(r["kernels"] == (path == "kernels") for r in results)
    cases = {}
    for r in results:
        cases.setdefault(r["case"], {})[r["rank"]] = np.array(r["grad"], dtype=np.float32)
    g = [rank_vector(r) for r in range(world)]
    mean_abs = [np.float32(np.abs(x).astype(np.float64).mean()) for x in g]
    expected = {
        "int8": (np_int8(g[0], 128) + np_int8(g[1], 128)) / world,
        "onebit": (signs(g[0]) * mean_abs[0] + signs(g[1]) * mean_abs[1]) / world,
        "signum": np.sign(signs(g[0]) + signs(g[1])),
        "twobit": sum(np.where(x >= 0.5, 0.5, np.where(x <= -0.5, -0.5, 0)) for x in g) / world,
        "threshold": sum(np.where(np.abs(x) >= 1.0, x, 0) for x in g) / world,
        "powersgd_dense_1d": sum(g) / world,
    }
    assert set(cases) == set(expected)
    for case, want in expected.items():
        for rank in range(world):
            np.testing.assert_allclose(cases[case][rank], want, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{case} rank {rank}")
