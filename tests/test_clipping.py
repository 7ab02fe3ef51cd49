"""Clipping with compression: ``clip_grad_norm`` clips each rank's local gradients together to
c * sqrt(N) (op=Average: the DGC paper's c / sqrt(N) on each rank's share g / N) before
compression (and before error feedback), and the clipping trap (changing
p.grad between synchronize() and step() with a compressor that carries state) warns once.
Expected values are computed here in numpy."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_horovod

pytestmark = pytest.mark.horovod
C, WORLD, LR = 1.5, 2, 0.1


def rank_vector(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def local_grads(rank: int, step: int, part: int = 0) -> tuple:
    seed = 1000 + 100 * step + 10 * part
    return rank_vector(rank, 60, seed).astype(np.float64), rank_vector(rank, 40, seed + 5).astype(np.float64)


def clip(a: np.ndarray, b: np.ndarray) -> tuple:
    norm = np.sqrt(np.sum(a * a) + np.sum(b * b))
    coef = min(1.0, C * np.sqrt(WORLD) / (norm + 1e-6))
    return a * coef, b * coef


def topk(x: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out[idx] = x[idx]
    return out


@pytest.fixture(scope="module")
def cases():
    out = {}
    for r in run_horovod("torch_clipping.py", np=WORLD):
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


def expected_run(compress, steps: int = 2, passes: int = 1) -> tuple:
    w = [np.zeros(60), np.zeros(40)]
    residual = {r: [np.zeros(60), np.zeros(40)] for r in range(WORLD)}
    for step in range(steps):
        sent = []
        for r in range(WORLD):
            parts = [local_grads(r, step, p) for p in range(passes)]
            g = clip(sum(p[0] for p in parts), sum(p[1] for p in parts))
            sent.append(compress(g, residual[r]))
        for i in range(2):
            w[i] = w[i] - LR * np.mean([s[i] for s in sent], axis=0)
    return w


def no_compression(g, residual):
    return g


def topk_ef(g, residual):
    out = []
    for i in range(2):
        p = g[i] + residual[i]
        out.append(topk(p, 10))
        residual[i] = p - out[-1]
    return out


@pytest.mark.parametrize("case,compress,passes,steps", [
    ("clip_none", no_compression, 1, 2),
    ("clip_topk_ef", topk_ef, 1, 2),
    ("clip_bpps2", no_compression, 2, 1),
])
def test_clip_grad_norm_equals_hand_computed_local_clip(cases, case, compress, passes, steps):
    a, b = expected_run(compress, steps=steps, passes=passes)
    for r in range(WORLD):
        np.testing.assert_allclose(cases[case][r]["a"], a, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(cases[case][r]["b"], b, rtol=2e-5, atol=1e-6)
    assert cases[case][0]["a"] == cases[case][1]["a"]


def test_the_local_clip_is_active_in_this_toy():
    """The toy's gradients are larger than c * sqrt(N), so the tests above test the clip."""
    a, b = local_grads(0, 0)
    assert np.sqrt(np.sum(a * a) + np.sum(b * b)) > 3 * C * np.sqrt(WORLD)


@pytest.mark.parametrize("case", ["warn_dgc_trap", "warn_ef_trap"])
def test_clipping_after_synchronize_with_state_warns_once(cases, case):
    for r in range(WORLD):
        ws = cases[case][r]["warnings"]
        assert len(ws) == 1, ws
        assert "clip_grad_norm" in ws[0] and "between optimizer.synchronize() and optimizer.step()" in ws[0]


@pytest.mark.parametrize("case", ["warn_dgc_recommended", "warn_none_horovod_pattern"])
def test_recommended_paths_do_not_warn(cases, case):
    for r in range(WORLD):
        assert cases[case][r]["warnings"] == []


def test_local_clip_limit_is_the_papers_per_rank_rule():
    """The paper clips each rank's share G_k = g_k / N to c / sqrt(N): on the local mean
    gradient g_k (op=Average) that is c * sqrt(N); on G_k itself (op=Sum) c / sqrt(N)."""
    from hvdcompress.clipping import local_clip_limit
    assert local_clip_limit(2.0, 4, average=True) == 4.0
    assert local_clip_limit(2.0, 4, average=False) == 1.0
