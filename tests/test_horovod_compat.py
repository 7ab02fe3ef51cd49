"""Horovod's own optimizer behaviours on hvdcompress's optimizer, under real Horovod processes:
the optimizer tests of horovod/horovod's test/parallel/test_torch.py (parameter names,
duplicate and missing names, dynamic requires_grad, clipping between synchronize() and step(),
the synchronize-step warning, sparse embeddings, no named parameters, unused parameters) with
compression none and fp16, and process sets (Horovod's test_optimizer_process_sets and a
two-set variant at 4 ranks). Every expected value is computed here by hand or in numpy."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from conftest import run_horovod, run_scripts

pytestmark = pytest.mark.horovod


def rank_vector(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def cases_by_rank(results) -> dict:
    out = {}
    for r in results:
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


@pytest.fixture(scope="module")
def compat_runs() -> dict:
    """Both compressions' records, from one launch."""
    return run_scripts([(spec, "torch_horovod_compat", [spec], {}) for spec in ("none", "fp16")])


@pytest.fixture(params=["none", "fp16"])
def compat(request, compat_runs):
    return request.param, cases_by_rank(compat_runs[request.param])


def test_parameter_names_match_horovods(compat):
    _, cases = compat
    for r in (0, 1):
        seen = cases["parameter_names"][r]
        assert seen["unnamed"] == [f"allreduce.noname.{i}" for i in range(4)]
        assert seen["named"] == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_duplicate_and_missing_names_are_value_errors(compat):
    _, cases = compat
    for r in (0, 1):
        seen = cases["bad_names"][r]
        assert seen["duplicate"] is not None and "unique" in seen["duplicate"]
        assert seen["missing"] is not None and "not in it" in seen["missing"]


def test_dynamic_requires_grad_trains_only_the_enabled_model(compat):
    _, cases = compat
    seen = cases["dynamic_requires_grad"]
    assert seen[0]["moved"] == [[True, False], [False, True]] * 2
    assert seen[0]["gen"] == seen[1]["gen"] and seen[0]["disc"] == seen[1]["disc"]


def test_clipping_between_synchronize_and_step(compat):
    _, cases = compat
    # w = 0.5, b = 0, x = y = 1: d/dw (w x + b - y)^2 = d/db = -1 on both ranks
    coef = 0.1 / (math.sqrt(2.0) + 1e-6)
    for r in (0, 1):
        seen = cases["clip_after_synchronize"][r]
        assert seen["prior"] == -1.0
        assert seen["clipped"] == pytest.approx(-coef, rel=1e-6)
        assert seen["weight"] == pytest.approx(0.5 + 0.1 * coef, rel=1e-6)
        assert seen["bias"] == pytest.approx(0.1 * coef, rel=1e-6)
        assert seen["warnings"] == []  # stateless compressors: Horovod's pattern is right


def test_synchronize_then_step_warns_once(compat):
    _, cases = compat
    for r in (0, 1):
        ws = cases["synchronize_step_warning"][r]["warnings"]
        assert len(ws) == 1 and "optimizer.step() called without optimizer.skip_synchronize()" in ws[0]


@pytest.mark.parametrize("as_dense", [0, 1])
def test_sparse_embeddings(compat, as_dense):
    _, cases = compat
    expected = np.zeros((5, 3), np.float32)  # rank r: row r scaled 1 + r, row 3 scaled 2
    for r in (0, 1):
        expected[r] -= (1.0 + r) / 2
        expected[3] -= 2.0 / 2
    for r in (0, 1):
        np.testing.assert_array_equal(cases[f"sparse_embedding_dense{as_dense}"][r]["weight"], expected)


def test_no_named_parameters_and_unused_parameters(compat):
    _, cases = compat
    assert cases["no_named_parameters"][0]["moved"]
    for case in ("no_named_parameters", "force_allreduce"):
        assert cases[case][0]["params"] == cases[case][1]["params"], case


def sgd_momentum(grads: list, lr: float = 0.1, mu: float = 0.9) -> np.ndarray:
    """torch.optim.SGD with momentum from w = 0 over the given per-step gradients."""
    w = np.zeros_like(grads[0])
    v = None
    for g in grads:
        v = g.copy() if v is None else mu * v + g
        w = w - lr * v
    return w


def set_average(members: list, step: int, spec: str) -> np.ndarray:
    vs = [rank_vector(r, 64, seed=100 + 10 * step) for r in members]
    if spec == "fp16":  # Horovod sums float16 payloads in float16
        total = vs[0].astype(np.float16)
        for v in vs[1:]:
            total = total + v.astype(np.float16)
        return total.astype(np.float32) / len(members)
    return np.sum(vs, axis=0, dtype=np.float32) / len(members)


PROCESS_SET_SPECS = {2: ("none", "dgc"), 4: ("fp16", "dgc")}


@functools.lru_cache(maxsize=None)
def process_set_launch(np_: int) -> tuple:
    """The records of one launch at ``np_`` ranks, for each of its compressions in turn."""
    return tuple(run_horovod("torch_process_sets.py", np=np_, timeout=240,
                             args=[",".join(PROCESS_SET_SPECS[np_])]))


@pytest.mark.parametrize("np_,spec", [(np_, spec) for np_, specs in PROCESS_SET_SPECS.items() for spec in specs])
def test_process_sets(np_, spec):
    cases = cases_by_rank([r for r in process_set_launch(np_) if r["spec"] == spec])
    evens = [r for r in range(np_) if r % 2 == 0]
    odds = [r for r in range(np_) if r % 2 == 1]
    for r in range(np_):
        assert cases["after"][r]["total"] == sum(range(np_))  # nobody hung or skipped a step
    for r in odds:  # outside the set: its own gradients, momentum SGD, nothing sent
        own = sgd_momentum([rank_vector(r, 64, seed=100 + 10 * s) for s in range(2)])
        np.testing.assert_allclose(cases["one_set"][r]["w"], own, rtol=1e-6, atol=1e-7)
        assert cases["one_set"][r]["sent"] == 0
    for case, sets in (("one_set", [evens]), ("own_set", [evens, odds])):
        for members in sets:
            ws = [cases[case][r]["w"] for r in members]
            assert all(w == ws[0] for w in ws), (case, members)
            if spec != "dgc":
                expected = sgd_momentum([set_average(members, s, spec) for s in range(2)])
                np.testing.assert_allclose(ws[0], expected, rtol=1e-6, atol=1e-7)
