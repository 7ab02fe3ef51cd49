"""Clipping with compression: ``clip_grad_norm`` clips each rank's local gradients together to
c * sqrt(N) (op=Average: the DGC paper's c / sqrt(N) on each rank's share g / N) before
compression (and before error feedback) when the compressor carries state, and the exchanged
average to c (Horovod's clip) when it does not; the clipping trap (changing
p.grad between synchronize() and step() with a compressor that carries state) warns once.
Expected values are computed here in numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_horovod

import hvdcompress as hc

pytestmark = pytest.mark.horovod
C, WORLD, LR = 1.5, 2, 0.1


def rank_vector(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def local_grads(rank: int, step: int, part: int = 0) -> tuple:
    seed = 1000 + 100 * step + 10 * part
    return rank_vector(rank, 60, seed).astype(np.float64), rank_vector(rank, 40, seed + 5).astype(np.float64)


def clip(a: np.ndarray, b: np.ndarray, limit: float = C * np.sqrt(WORLD)) -> tuple:
    norm = np.sqrt(np.sum(a * a) + np.sum(b * b))
    coef = min(1.0, limit / (norm + 1e-6))
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


def expected_run(compress, steps: int = 2, passes: int = 1, local: bool = True) -> tuple:
    """SGD from 0: with ``local``, each rank's gradients clipped to C·sqrt(N) before ``compress``
    (the DGC paper's rule, for compressors with state); else the average clipped to C (Horovod's
    clip after synchronize(), for stateless ones)."""
    w = [np.zeros(60), np.zeros(40)]
    residual = {r: [np.zeros(60), np.zeros(40)] for r in range(WORLD)}
    for step in range(steps):
        sent = []
        for r in range(WORLD):
            parts = [local_grads(r, step, p) for p in range(passes)]
            g = (sum(p[0] for p in parts), sum(p[1] for p in parts))
            sent.append(compress(clip(*g) if local else g, residual[r]))
        update = [np.mean([s[i] for s in sent], axis=0) for i in range(2)]
        if not local:
            update = clip(*update, limit=C)
        for i in range(2):
            w[i] = w[i] - LR * update[i]
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


@pytest.mark.parametrize("case,compress,passes,steps,local", [
    ("clip_none", no_compression, 1, 2, False),
    ("clip_topk_ef", topk_ef, 1, 2, True),
    ("clip_bpps2", no_compression, 2, 1, False),
    ("clip_bpps2_topk_ef", topk_ef, 2, 1, True),
])
def test_clip_grad_norm_equals_the_hand_computed_clip(cases, case, compress, passes, steps, local):
    """Local clip before compression with state (top-k + EF), Horovod's clip of the average
    without (none); backward_passes_per_step=2 clips the accumulated gradient either way."""
    a, b = expected_run(compress, steps=steps, passes=passes, local=local)
    for r in range(WORLD):
        np.testing.assert_allclose(cases[case][r]["a"], a, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(cases[case][r]["b"], b, rtol=2e-5, atol=1e-6)
    assert cases[case][0]["a"] == cases[case][1]["a"]


def test_both_clips_are_active_and_differ_in_this_toy():
    """The toy's gradients are larger than c * sqrt(N) and their average larger than c, so the
    tests above test the clip, and the two rules give different weights."""
    a, b = local_grads(0, 0)
    assert np.sqrt(np.sum(a * a) + np.sum(b * b)) > 3 * C * np.sqrt(WORLD)
    mean = [np.mean([local_grads(r, 0)[i] for r in range(WORLD)], axis=0) for i in range(2)]
    assert np.sqrt(sum(np.sum(m * m) for m in mean)) > 2 * C
    local, exact = expected_run(no_compression), expected_run(no_compression, local=False)
    assert not np.allclose(local[0], exact[0], rtol=1e-3)


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
    from hvdcompress.step.clipping import local_clip_limit
    assert local_clip_limit(2.0, 4, average=True) == 4.0
    assert local_clip_limit(2.0, 4, average=False) == 1.0


def test_the_adam_take_over_clips_the_mean_in_v_steps_and_scales_each_rank_after():
    """StepDriver with FrozenAdam: a v-step clips after the exchange (Horovod's pattern) and keeps
    the coefficient; a compressed step clips before, each rank scaled by that coefficient first
    (then the paper's c·sqrt(N)); the coefficient survives a checkpoint. Without the take-over
    the scale stays 1 and nothing is kept."""
    import hvdcompress as hc
    from hvdcompress.step.driver import StepDriver
    from hvdcompress.step.options import parse_options
    from hvdcompress.torch.tensors import OPS

    adam = hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2)
    options = parse_options(adam, op="avg", average_op="avg", sum_op="sum", clip_grad_norm=2.0)
    driver = StepDriver(options, OPS, engine=None, comm=None, who="test", adam=adam)
    assert driver.clips_before() is False and driver.clip_scale() == 1.0   # step 1: a v-step
    driver.clipped_after(torch.tensor(0.25))
    assert driver.clip_scale() == 0.25
    adam.steps = 2   # step 3: compressed
    assert driver.clips_before() is True and driver.clip_scale() == 0.25
    fresh = hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2)
    fresh.load_state_dict(adam.state_dict())
    assert fresh.clip_scale == 0.25 and fresh.steps == 2
    plain = StepDriver(parse_options(hc.ErrorFeedback(hc.OneBit()), op="avg", average_op="avg", sum_op="sum",
                                     clip_grad_norm=2.0), OPS, engine=None, comm=None, who="test")
    plain.clipped_after(torch.tensor(0.25))
    assert plain.clips_before() is True and plain.clip_scale() == 1.0


def test_clip_gradients_scales_first_then_clips():
    """clip_gradients(scale=s): the coefficient min(s, limit / norm), applied and returned."""
    from hvdcompress.torch.clipping import clip_gradients
    g = [torch.full((4,), 3.0), torch.full((4,), 4.0)]   # norm 10
    coef = clip_gradients(g, limit=4.0, scale=0.5)     # 0.5 -> norm 5 -> clipped to 4
    assert float(coef) == pytest.approx(0.4, rel=1e-5)
    assert float(torch.linalg.vector_norm(torch.cat(g))) == pytest.approx(4.0, rel=1e-5)
    h = [torch.full((4,), 0.5)]   # norm 1: only the scale acts
    assert float(clip_gradients(h, limit=4.0, scale=0.5)) == pytest.approx(0.5)
    assert clip_gradients([], 1.0) is None


@pytest.mark.parametrize("compression,intra_node,warns", [
    (hc.FP16(), None, False), (hc.FP16(), hc.FP16(), False),
    (hc.FP16(), hc.ErrorFeedback(hc.OneBit()), True), (hc.DGC(0.99), hc.FP16(), True)])
def test_the_trap_watch_sees_state_at_either_level(compression, intra_node, warns):
    """GradientWatch (torch) warns when a gradient changes between synchronize() and step() and
    the compressor, or the two-level intra_node one, carries state; clipping is then applied
    before the exchange by clip_grad_norm (clips_before_exchange agrees)."""
    import warnings

    import torch

    from hvdcompress.step.clipping import clips_before_exchange
    from hvdcompress.torch.clipping import GradientWatch
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    watch = GradientWatch(compression, intra_node)
    watch.record([p])
    p.grad.mul_(0.5)  # the user's clip after synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        watch.check({p: "w"})
    assert len(seen) == int(warns), [str(w.message) for w in seen]
    assert clips_before_exchange(compression, intra_node) == warns
