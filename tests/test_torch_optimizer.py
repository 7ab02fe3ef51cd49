"""hvdcompress.torch.DistributedOptimizer under real Horovod processes (horovodrun --gloo)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import run_horovod, run_scripts

pytestmark = pytest.mark.horovod
N = 1000


def rank_vector(rank: int, n: int = N, seed: int = 100) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def np_topk_dense(x: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out[idx] = x[idx]
    return out


def by_rank(results, key):
    grouped = {}
    for r in results:
        grouped.setdefault(r[key], {})[r["rank"]] = r
    return grouped


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    """The records of the 2-rank optimizer scripts, by script, from one launch; the agreement
    errors of torch_mismatch.py run last."""
    scripts = ("torch_aggregate", "torch_dgc_equivalence", "torch_ef_conservation", "torch_edge",
               "torch_fusion", "torch_mismatch")
    return run_scripts([(name, name, [], {}) for name in scripts])


def test_aggregated_gradients_equal_hand_computed_sums(two_ranks):
    world = 2
    cases = by_rank(two_ranks["torch_aggregate"], "case")
    g = [rank_vector(r) for r in range(world)]
    topk_sum = sum(np_topk_dense(x, 50) for x in g)
    expected = {
        "topk50_avg": topk_sum / world,
        "topk50_sum": topk_sum,
        "topk50_predivide": sum(np_topk_dense(x / 2, 50) for x in g) * 2 / world,
        # DGC's first step: u = g, v = u; exact threshold, k = 10 per rank
        "dgc99_exact": sum(np_topk_dense(x, 10) for x in g) / world,
        "fp16": sum(x.astype(np.float16) for x in g).astype(np.float32) / world,
        "dense": sum(g) / world,
    }
    for case, want in expected.items():
        for rank in range(world):
            got = np.array(cases[case][rank]["grad"], dtype=np.float32)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{case} rank {rank}")
    # random-k: every rank picked the same 100 indices, so at most 100 non-zeros in the sum
    rk = np.array(cases["randomk"][0]["grad"])
    nz = np.nonzero(rk)[0]
    assert len(nz) == 100
    np.testing.assert_allclose(rk[nz], (g[0][nz] + g[1][nz]) / 2, rtol=1e-6)


def test_dgc_at_zero_sparsity_without_masking_follows_dense_momentum_sgd(two_ranks):
    results = two_ranks["torch_dgc_equivalence"]
    assert len(results) == 8  # 2 ranks x nesterov x {dense path, sparse path}
    for r in results:
        assert r["moved"] > 1e-3
        assert r["max_diff"] < 1e-5, r
    sparse = [r for r in results if r["path"] == "sparse-path"]
    dense = [r for r in results if r["path"] == "dense-path"]
    # the sparse path really sent (value, index) pairs: twice the dense bytes
    assert all(s["summable_sent"] == 2 * d["summable_sent"] for s, d in zip(sparse, dense))


def test_error_feedback_loses_nothing(two_ranks):
    assert len(two_ranks["torch_ef_conservation"]) == 2
    for r in two_ranks["torch_ef_conservation"]:
        assert r["residual_norm"] > 1e-3  # something was held back...
        assert r["max_error"] < 1e-5      # ...and nothing was lost


RESUME_RANKS = 4  # one launch for every case (2 nodes x 2 for two-level)
RESUME = {  # case: state keys it must have
    "dgc_sampled_warmup": [], "topk_ef_nesterov": [], "randomk_ef": [],
    # the compressed allreduce's client residual per segment and server residual (issue 12.1)
    "onebit_ef_alltoall": ["seg0.residual", "seg1.residual", "seg2.residual", "seg3.residual",
                           "sum.residual"],
    # two-level, 2 nodes x 2: the shard's compressed allreduce across the nodes, under cross.
    "two_level_onebit_ef": ["cross.seg0.residual", "cross.seg1.residual", "cross.sum.residual"],
}


@pytest.fixture(scope="module")
def resumes() -> dict:
    """tests/hvd/torch_resume.py's records by case, all cases in one launch. Horovod's tensor
    fusion off: at more than 2 ranks a ring allreduce's sums depend on where its chunks begin,
    hence on which tensors a cycle happened to fuse, so two runs of the same steps may differ in
    the last bits (every rank still gets the same bits); unfused, each allreduce is repeatable."""
    out: dict = {}
    for r in run_horovod("torch_resume.py", np=RESUME_RANKS, args=[",".join(RESUME)], timeout=300,
                         env={"HOROVOD_FUSION_THRESHOLD": "0"}):
        out.setdefault(r["case"], []).append(r)
    return out


@pytest.mark.parametrize("case", list(RESUME))
def test_state_dict_round_trip_gives_the_same_next_steps(resumes, case):
    keys = RESUME[case]
    results = resumes[case]
    assert len(results) == RESUME_RANKS
    for r in results:
        assert r["diff"] == 0.0, r
        assert r["diff_without_state"] > 1e-6, "the compressor state made no difference"
        assert r["state_keys"] and set(keys) <= set(r["state_keys"]), r["state_keys"]


def test_ranks_that_disagree_get_a_clear_error_and_those_that_agree_none(two_ranks):
    cases = by_rank(two_ranks["torch_mismatch"], "case")
    for case, message in (("extra_param", "ranks disagree on params"),
                          ("renamed", "ranks disagree on params"),
                          ("compressor", "ranks disagree on compression")):
        assert len(cases[case]) == 2
        for r in cases[case].values():
            assert r["error"] is not None and message in r["error"], (case, r)
    assert [r["error"] for r in cases["same"].values()] == [None, None]


@pytest.fixture(scope="module")
def edge_cases(two_ranks):
    return by_rank(two_ranks["torch_edge"], "case")


def test_unusual_gradients_and_features(edge_cases):
    cases = edge_cases
    for label in ("topk_ef", "dgc", "dgc_masking", "dgc_dense", "csc"):
        for r in cases[f"nan_{label}"].values():
            assert r["nan_at_7"] and r["nan_count"] == 1 and r["next_finite"], r
    a0, a1 = rank_vector(0, 50), rank_vector(1, 50)
    for r in cases["unused_and_small"].values():
        np.testing.assert_allclose(r["a"], (a0 + a1) / 2, rtol=1e-6)
        np.testing.assert_allclose(r["b"], a0 / 2, rtol=1e-6)  # rank 1 sent zeros
        assert r["empty"] == [0]
    accumulated = [rank_vector(r, 200) + rank_vector(r + 10, 200) for r in range(2)]
    want = sum(np_topk_dense(g, 20) for g in accumulated) / 2
    for r in cases["bpps2"].values():
        np.testing.assert_allclose(r["grad"], want, rtol=1e-6, atol=1e-7)
    for r in cases["bpps_exceeded"].values():
        assert "more than backward_passes_per_step" in r["error"]
    assert all(r["same"] for r in cases["groups"].values())
    for r in cases["zero_grad_race"].values():
        assert "zero_grad() was called after loss.backward()" in r["error"]
    want = np.zeros((20, 4), np.float32)
    for rank in range(2):
        want[[rank, 5]] += 0.5
    for sad in (False, True):
        for r in cases[f"embedding_sparse_as_dense={sad}"].values():
            np.testing.assert_allclose(r["grad"], want, rtol=1e-6)


def test_broadcast_optimizer_state_takes_rank0_schedule_without_a_step(edge_cases):
    for r in edge_cases["broadcast_state"].values():
        assert r == {**r, "steps": 0, "dgc_step": 3, "grad_none": True}, r


# ---- fusion= (tests/hvd/torch_fusion.py; the numpy references of tests/test_fusion.py) ----------
def test_fused_buckets_match_numpy_over_real_ranks(two_ranks):
    """One bucket of four parameters: fp16 rounds each element; error-fed onebit sends one scale
    for the bucket and keeps one residual, under the bucket's name, over two steps."""
    from test_fusion import SIZES, grads, onebit

    cases = by_rank(two_ranks["torch_fusion"], "case")
    names = sorted(SIZES)
    residual = [np.zeros(sum(SIZES.values()), np.float32) for _ in range(2)]
    for step in range(2):
        decoded = []
        for r in range(2):
            p = np.concatenate([grads(r, step)[n] for n in names]) + residual[r]
            decoded.append(onebit(p))
            residual[r] = p - decoded[-1]
        want = dict(zip(names, np.split(sum(decoded) / 2, np.cumsum([SIZES[n] for n in names])[:-1])))
        for r in range(2):
            for n in names:
                np.testing.assert_allclose(cases["ef_onebit"][r]["grads"][step][n], want[n], rtol=1e-6,
                                           atol=1e-7, err_msg=f"{n} step {step} rank {r}")
    fp16 = {n: sum(grads(r, 0)[n].astype(np.float16) for r in range(2)).astype(np.float32) / 2 for n in names}
    for n in names:
        np.testing.assert_allclose(cases["fp16"][0]["grads"][0][n], fp16[n], rtol=1e-6, err_msg=n)
    for case in ("ef_onebit", "fp16"):
        assert cases[case][0]["plan"] == ["fused[a.bias..b.weight]"], case
    assert "fused[a.bias..b.weight]" in cases["ef_onebit"][0]["state"]


@pytest.mark.parametrize("case, buckets", [
    ("dgc_two_groups", ["fused[0.bias..0.weight]", "fused[2.bias..2.weight]"]),
    ("frozen_adam_onebit", ["fused[0.bias..2.weight]"]),
    ("frozen_adam_small", ["fused[2.bias..2.weight]"])])   # FrozenAdam's live small tensors fuse apart
def test_fused_take_overs_train_identical_replicas_and_checkpoint(two_ranks, case, buckets):
    """DGC (momentum and weight decay taken over, one bucket per param group) and FrozenAdam
    around error-fed onebit (one bucket for the model) train with check_replicas=1; the
    gathered checkpoint gives back the same bucket state."""
    ranks = by_rank(two_ranks["torch_fusion"], "case")[case]
    alone = ["0.bias", "0.weight"] if case == "frozen_adam_small" else []   # a bucket of one is not fused
    assert ranks[0]["buckets"] == buckets and ranks[0]["plan"] == alone + buckets
    assert ranks[0]["moved"] > 1e-4 and ranks[0]["params"] == ranks[1]["params"]
    assert ranks[0]["reloaded_same"] and ranks[1]["reloaded_same"]
