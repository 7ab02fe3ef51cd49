"""hvdcompress.tensorflow and .keras under real Horovod processes (horovodrun -np 2 --gloo).

References are computed here, in numpy, from the data the scripts generate.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_horovod

pytestmark = pytest.mark.horovod
KERAS2 = not getattr(tf.keras, "__version__", "2").startswith("3")  # TF 2.15's tf.keras: no __version__
IN, OUT, BATCH = 64, 16, 32  # as in tests/hvd/tf_train.py


def rank_data(rank: int):
    rng = np.random.default_rng(100 + rank)
    return (rng.standard_normal((BATCH, IN)).astype(np.float32),
            rng.standard_normal((BATCH, OUT)).astype(np.float32))


def momentum_sgd_reference(steps: int, lr: float, momentum: float, nesterov: bool,
                           passes: int = 1, world: int = 2) -> np.ndarray:
    """Momentum SGD (torch form) on the rank-averaged gradient of 0.5 * ||x W - y||^2, summed
    over ``passes`` backward passes per step (Horovod's default for backward_passes_per_step)."""
    w = np.zeros((IN, OUT), np.float64)
    buf = np.zeros_like(w)
    data = [rank_data(r) for r in range(world)]
    for _ in range(steps):
        g = passes * sum(x.T @ (x @ w - y) / BATCH for x, y in data) / world
        buf = momentum * buf + g
        w -= lr * (g + momentum * buf if nesterov else buf)
    return w.ravel()


def train_runs(runs: list) -> list:
    """Run tests/hvd/tf_train.py on 2 ranks; per run, the weights of rank 0 and rank 1."""
    results = run_horovod("tf_train.py", args=[json.dumps(runs)], timeout=600)
    weights = [[None, None] for _ in runs]
    for r in results:
        weights[r["run"]][r["rank"]] = r["weights"]
    return weights


def dense_equivalent_runs() -> list:
    """Configurations that each equal momentum SGD on the averaged gradient."""
    dgc0 = {"compressor": "dgc", "sparsity": "0", "masking": "false", "min_numel": "0"}
    runs = []
    for api, function in (("tape", False), ("tape", True), ("optimizer", True), ("fit", False)):
        for spec, momentum, nesterov in (({"compressor": "none"}, 0.9, False),
                                         ({"compressor": "fp16"}, 0.0, False),
                                         (dgc0, 0.9, False), (dgc0, 0.9, True)):
            run = {"api": api, "function": function, "compression": spec, "steps": 4,
                   "momentum": momentum, "nesterov": nesterov}
            if api == "tape" and spec is dgc0:  # no optimizer to take momentum from: DGC's own
                run.update(momentum=0.0, nesterov=False, compression=dict(
                    spec, momentum_mu=str(momentum), momentum="nesterov" if nesterov else "plain"))
            runs.append(run)
    runs.append({"api": "optimizer", "function": True, "compression": {"compressor": "none"},
                 "steps": 4, "momentum": 0.9, "nesterov": False, "passes": 2})
    runs.append({"api": "optimizer", "function": False, "compression": dgc0, "steps": 4,
                 "momentum": 0.9, "nesterov": False, "passes": 3})
    return runs


def sparse_runs() -> list:
    """Sparse and stateful configurations from a random start (replicas only)."""
    return [{"api": api, "compression": spec, "steps": 6, "init": "random", "function": True,
             "momentum": 0.0 if (api == "tape" and spec["compressor"] == "dgc") else 0.9}
            for api in ("tape", "fit")
            for spec in ({"compressor": "dgc", "sparsity": "0.99", "min_numel": "0"},
                         {"compressor": "topk", "k": "0.05", "ef": "vanilla"},
                         {"compressor": "randomk", "k": "0.1", "seed": "3", "ef": "vanilla"},
                         {"compressor": "bf16"})]


@pytest.fixture(scope="module")
def trained() -> dict:
    """Both lists of runs in one launch of tests/hvd/tf_train.py: name -> [(run, weights)]."""
    runs = {"dense": dense_equivalent_runs(), "sparse": sparse_runs()}
    weights = train_runs(runs["dense"] + runs["sparse"])
    return {"dense": list(zip(runs["dense"], weights[:len(runs["dense"])])),
            "sparse": list(zip(runs["sparse"], weights[len(runs["dense"]):]))}


def test_dense_equivalents_match_numpy_momentum_sgd(trained):
    for run, (w0, w1) in trained["dense"]:
        assert w0 == w1, f"ranks ended with different weights: {run}"
        momentum = 0.9 if "momentum_mu" in run["compression"] else run["momentum"]
        nesterov = run["nesterov"] or run["compression"].get("momentum") == "nesterov"
        expected = momentum_sgd_reference(4, 0.1, momentum, nesterov, run.get("passes", 1))
        tol = 2e-3 if run["compression"]["compressor"] == "fp16" else 2e-5
        np.testing.assert_allclose(w0, expected, rtol=tol, atol=tol, err_msg=str(run))


def test_sparse_training_keeps_ranks_identical_from_random_init(trained):
    assert len(trained["sparse"]) == 8
    for run, (w0, w1) in trained["sparse"]:
        assert w0 == w1, f"ranks ended with different weights: {run}"
        assert np.abs(np.asarray(w0)).max() > 0, f"nothing trained: {run}"


def np_topk(c: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(c)
    idx = np.argsort(-np.abs(c), kind="stable")[:k]
    out[idx] = c[idx]
    return out


def cases_of(records: list) -> dict:
    """case -> that case's records, in rank order."""
    out: dict = {}
    for r in sorted(records, key=lambda r: r["rank"]):
        out.setdefault(r["case"], []).append(r)
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """tests/hvd/tf_two_ranks.py: the records of its scripts, by script, one launch."""
    out: dict = {}
    for r in run_horovod("tf_two_ranks.py", args=[tmp_path_factory.mktemp("ckpt")], timeout=600):
        out.setdefault(r.pop("script"), []).append(r)
    return out


@pytest.fixture(scope="module")
def sparse_sums(two_ranks) -> dict:
    return cases_of(two_ranks["tf_sparse_sum"])


@pytest.mark.parametrize("op", ["average", "sum"])
def test_topk_allgather_equals_hand_computed_sum(sparse_sums, op):
    n, k = 1000, 50
    results = sparse_sums[f"topk.{op}"]
    c = [np.random.default_rng(10 + r).standard_normal(n).astype(np.float32) for r in range(2)]
    expected = np_topk(c[0], k) + np_topk(c[1], k)
    if op == "average":
        expected = expected / np.float32(2)
    for r in results:
        np.testing.assert_array_equal(np.asarray(r["grad"], np.float32), expected)
        assert r["bytes"]["sent"] == k * (4 + 4) and r["bytes"]["dense"] == n * 4


def test_indexed_slices_pass_through_uncompressed(sparse_sums):
    results = sparse_sums["slices"]
    expected = np.zeros((10, 4), np.float32)
    for rank in range(2):
        for row in (rank, 3, 3):  # rank r looks up rows [r, 3, 3] with weight r + 1
            expected[row] += rank + 1
    expected /= 2
    for r in results:
        assert r["is_slices"]
        np.testing.assert_array_equal(np.asarray(r["grad"], np.float32), expected)


@pytest.fixture(scope="module")
def warmups(two_ranks) -> dict:
    return cases_of(two_ranks["tf_warmup"])


def test_exponential_warmup_per_epoch_reaches_the_logs(warmups):
    results = warmups["exp"]
    expected = [1 - 0.001 ** ((e + 1) / 3) for e in range(3)] + [0.999, 0.999]
    for r in results:
        np.testing.assert_allclose(r["sparsity"], expected, rtol=1e-6)  # Horovod's
        # MetricAverageCallback (Keras 2) averages every log value, ours too, in float32
        assert r["sent"][0] > r["sent"][1] > r["sent"][2] > 0, r["sent"]
        assert r["sent"][2] <= np.ceil(64 * 64 * 0.001) * 8  # the epoch's last step at 99.9%
    assert results[0]["weights"] == results[1]["weights"]


def test_list_warmup_per_step_reaches_the_logs(warmups):
    results = warmups["list"]
    sparsities, begin, length = [0.5, 0.75, 0.9], 2, 3

    def at(t):  # Paddle's rampup: dense before begin, the list walked over length steps
        return 0.0 if t < begin else sparsities[min((t - begin) * 3 // length, 2)]

    expected = [at(2 * (e + 1)) for e in range(5)]  # 2 optimizer steps per epoch
    for r in results:
        np.testing.assert_allclose(r["sparsity"], expected, rtol=1e-6)
        assert r["sent"][0] == r["dense"]  # epoch 1's steps (t = 0, 1) were dense
        assert r["sent"][-1] <= np.ceil(64 * 64 * 0.1) * 8  # 90%: 8 bytes per element sent
    assert results[0]["weights"] == results[1]["weights"]


@pytest.fixture(scope="module")
def states(two_ranks) -> dict:
    return cases_of(two_ranks["tf_state"])


def test_checkpoint_round_trip_restores_compressor_state(states):
    results = states["checkpoint"]
    for r in results:
        assert all(v > 0 for v in r["saved"].values()), "nothing to restore: state is zero"
        assert r["saved_counters"]["step"] == 3
        assert r["restored_counters"] == r["continued_counters"]
        assert r["resumed"] == r["continued"], "resumed training differs from uninterrupted"
        assert r["resumed_without_state"] != r["continued"], "control: state made no difference"


def test_tf_function_step_does_not_retrace_on_sparsity_or_lr_change(states):
    results = states["retrace"]
    for r in results:
        assert r["traces"] == [r["traces"][0]] * 4, r["traces"]  # no trace after the first call
        assert r["sparsities"] == [1 - 0.5 ** 0.5, 0.5, 0.99, 0.99]
        n = 4096
        for s, sent in zip(r["sparsities"], r["sent"]):
            k = int(np.ceil(n * (1 - s)))
            assert 0.8 * k * 8 <= sent <= k * 8, (s, sent)  # the new sparsity is in force
        assert r["weights"][2] != r["weights"][1] and r["weights"][3] == r["weights"][2]  # lr=0
        assert r["step"] == 4


def test_tape_clip_grad_norm_and_process_set_exclusion():
    """clip_grad_norm clips each rank's gradients together to c * sqrt(N) before compression
    with state (top-k + EF), the exchanged average to c without (none), numpy reference below;
    a rank outside the process set keeps its own gradients."""
    def vectors(rank):  # as tf_clip_psets.py draws them: a (60) then b (40) from one stream
        rng = np.random.default_rng(1000 + rank)
        return [rng.standard_normal(n).astype(np.float32).astype(np.float64) for n in (60, 40)]

    cases = {}
    for r in run_horovod("tf_clip_psets.py", np=2):
        cases.setdefault(r["case"], {})[r["rank"]] = r

    def clipped(rank):
        a, b = vectors(rank)
        norm = np.sqrt(np.sum(a * a) + np.sum(b * b))
        limit = 1.5 * np.sqrt(2)
        assert norm > 2 * limit  # the clip is active
        return a * limit / norm, b * limit / norm

    def topk(x, k=10):
        out = np.zeros_like(x)
        idx = np.argsort(-np.abs(x), kind="stable")[:k]
        out[idx] = x[idx]
        return out

    def clipped_mean():  # stateless compression: Horovod's clip of the average, to c
        mean = [np.mean([vectors(r)[i] for r in range(2)], axis=0) for i in range(2)]
        norm = np.sqrt(sum(np.sum(m * m) for m in mean))
        assert norm > 2 * 1.5  # active, and a different result from the local clip
        return [m * 1.5 / norm for m in mean]

    local = [clipped(r) for r in range(2)]
    expected = {"tf_clip_none": clipped_mean(),
                "tf_clip_topk_ef": [np.mean([topk(g[i]) for g in local], axis=0) for i in range(2)]}
    for case, (a, b) in expected.items():
        for r in range(2):
            np.testing.assert_allclose(cases[case][r]["a"], a, rtol=2e-5, atol=1e-6)
            np.testing.assert_allclose(cases[case][r]["b"], b, rtol=2e-5, atol=1e-6)
    # rank 1 is outside {0}: its own gradient; rank 0 alone in {0}: its own as well
    for r in range(2):
        np.testing.assert_array_equal(cases["tf_outside_set"][r]["a"], vectors(r)[0].astype(np.float32))
        assert cases["tf_after"][r]["total"] == 1.0


@pytest.fixture(scope="module")
def front_end(two_ranks) -> dict:
    """tests/hvd/tf_front_end.py's records: case -> [rank 0's, rank 1's] error or weights."""
    cases: dict = {}
    for r in sorted(two_ranks["tf_front_end"], key=lambda r: r["rank"]):
        cases.setdefault(r["case"], []).append(r.get("error", r.get("weights")))
    return cases


def test_ranks_that_disagree_get_a_clear_error_at_the_first_exchange(front_end):
    """Rank agreement on TF (tape and Keras): variables, shapes and compressor, one launch."""
    cases = front_end
    for front in ("tape", "keras"):
        for case, message in (("extra_variable", "ranks disagree on params"),
                              ("shape", "ranks disagree on params"),
                              ("compressor", "ranks disagree on compression")):
            errors = cases[f"{front}.{case}"]
            assert len(errors) == 2 and all(e and message in e for e in errors), (front, case, errors)
        assert cases[f"{front}.same"] == [None, None]


def test_local_variables_keep_their_own_gradient(front_end):
    """register_local_source (tape) / register_local_var (Keras): TopK(2) of a constant vector
    sends its first 2 elements, so w's mean gradient is 1.5 there and 0 elsewhere (plus the
    residual-free TopK), while h steps by its own c_r = rank + 1 on every element, divided by
    the 2 ranks (Horovod's scale_local_gradients=True, on the tape and the Keras optimizer)
    unless scale_local_gradients=False; the replica guard (check_replicas=1) ignores h."""
    for front, scale in (("tape", 0.5), ("tape_unscaled", 1.0), ("keras", 0.5), ("keras_unscaled", 1.0)):
        for r, weights in enumerate(front_end[f"{front}.local"]):
            for step, (w, h) in enumerate(weights, start=1):
                assert w == [-1.5 * step, -1.5 * step, 0.0, 0.0], (front, r, w)
                assert h == [-(r + 1.0) * scale * step] * 4, (front, r, h)


def test_gradient_aggregation_counts_iterations_and_applies_every_fourth_call(front_end):
    """Horovod's test_gradient_aggregation: after call i (1-based) with 4 passes per step,
    k = i // 4 steps have run: x = -k·s, y = [1 + k·s, 2] with s = 1 (averaged) or 4 (summed);
    iterations = i. On Keras 2 also through a legacy optimizer's ``_compute_gradients`` (the
    exchange there), whose ``_agg_helper.counter`` is i % 4, as Horovod's."""
    paths = ["aggregate"] + (["aggregate_computed"] if KERAS2 else [])
    for path in paths:
        for average, s in ((True, 1.0), (False, 4.0)):
            for weights in front_end[f"{path}.{average}"]:
                for i, (x, y0, y1, iterations, *counter) in enumerate(weights, start=1):
                    k = i // 4
                    assert (x, y0, y1, iterations) == (-k * s, 1 + k * s, 2.0, i), (path, average, i)
                    assert counter == ([i % 4] if path == "aggregate_computed" else []), (path, i)


def topk_ef_means(grads: list, k: int) -> list:
    """Per step, the mean over ranks of top-k with error feedback (float32); ``grads[s][r]``:
    rank r's gradient at step s."""
    residuals = [np.zeros_like(g) for g in grads[0]]
    means = []
    for step in grads:
        sent = []
        for r, g in enumerate(step):
            acc = g + residuals[r]
            sent.append(np_topk(acc, k))
            residuals[r] = acc - sent[-1]
        means.append((sent[0] + sent[1]) / np.float32(2))
    return means


@pytest.mark.skipif(not KERAS2, reason="Keras 3's optimizers have no compute_gradients")
def test_keras2_compute_gradients_exchanges_once_whichever_path(front_end):
    """Keras 2: top-k(2) + EF on loss = w·c_r + h·c_r (h local), SGD(1.0), 3 steps, through the
    tape + apply_gradients, a legacy optimizer's _compute_gradients + apply_gradients (eager and
    in a tf.function), minimize and compute_gradients + apply_gradients (tf.function): every
    path ends where numpy does, bit for bit equal to the tape's, with 3 exchanges (one per
    step: a second exchange would compress the average again and move the residuals), and
    compute_gradients returns the exchanged (averaged) gradient, as Horovod's does."""
    def c_of(r: int, s: int) -> np.ndarray:   # as tests/hvd/tf_front_end.py
        return (np.array([1.0, -3.0, 2.5, 0.5]) * (1 + 0.25 * r)
                + s * np.array([0.1, 0.2, -0.3, 0.45])).astype(np.float32)

    means = topk_ef_means([[c_of(r, s) for r in range(2)] for s in range(3)], 2)
    tape = front_end["once.tape"]
    for path in ("tape", "legacy", "legacy_function", "minimize_function", "compute_function"):
        for r, record in enumerate(front_end[f"once.{path}"]):
            assert record["exchanges"] == 3, (path, r, record["exchanges"])
            assert [s[:2] for s in record["steps"]] == [s[:2] for s in tape[r]["steps"]], (path, r)
            w, h = np.zeros(4, np.float32), np.zeros(4, np.float32)
            for s, (got_w, got_h, returned) in enumerate(record["steps"]):
                w, h = w - means[s], h - c_of(r, s) / np.float32(2)
                np.testing.assert_allclose(got_w, w, rtol=1e-6, err_msg=f"{path} rank {r} step {s}")
                np.testing.assert_allclose(got_h, h, rtol=1e-6, err_msg=f"{path} rank {r} step {s}")
                if path in ("legacy", "legacy_function", "compute_function"):
                    np.testing.assert_allclose(returned, means[s], rtol=1e-6, err_msg=f"{path} step {s}")
    # a compute_gradients whose result is dropped exchanges (its residuals move); the tape's
    # gradients applied after it are exchanged too, not taken for its: the replicas stay equal
    dropped = front_end["once.dropped"]
    assert [r["exchanges"] for r in dropped] == [6, 6]
    assert [s[0] for s in dropped[0]["steps"]] == [s[0] for s in dropped[1]["steps"]]


@pytest.mark.skipif(not KERAS2, reason="Keras 3's fit calls apply_gradients (tested elsewhere)")
def test_keras2_fit_exchanges_in_compute_gradients_as_the_tape_path(front_end):
    """Keras 2's fit (minimize, so compute_gradients) with top-k(3) + EF, SGD(0.5), 3 steps of
    one sample: the kernel equals the tape + apply_gradients run bit for bit and numpy's
    (gradient x_r^T t_r of sum(x W * t)), with 3 exchanges."""
    x = [np.array([1.0 + 0.5 * r, -2.0, 0.75 + 0.25 * r], np.float32) for r in range(2)]
    t = [np.array([1.0, -0.5, 3.0 + r, 0.25], np.float32) for r in range(2)]
    grads = [np.outer(x[r], t[r]).astype(np.float32).ravel() for r in range(2)]
    kernel = np.zeros(12, np.float32)
    for mean in topk_ef_means([grads] * 3, 3):
        kernel = kernel - np.float32(0.5) * mean
    for r in range(2):
        fit, tape = front_end["once.fit_fit"][r], front_end["once.fit_tape"][r]
        assert fit == tape, (r, fit, tape)
        assert fit["exchanges"] == 3
        np.testing.assert_allclose(np.ravel(fit["kernel"]), kernel, rtol=1e-6)


def test_fused_tape_and_keras_match_numpy_and_keep_bucket_state(two_ranks):
    """tests/hvd/tf_fusion.py: the tape (eager, and inside a tf.function) fuses the four known
    gradients into one bucket of error-fed onebit: one scale and one residual for the bucket,
    as tests/test_fusion.py's numpy reference, over two steps; Keras fits with a fused top-k
    and error feedback, replicas compared at every step."""
    from adam_reference import onebit_ef  # numpy only: this test runs without torch (Keras 3)
    from hvd.fusion_data import SIZES, grads

    cases = cases_of(two_ranks["tf_fusion"])
    names = list(SIZES)   # the tape's variables, in SIZES's order; the bucket takes name order
    residual = [np.zeros(sum(SIZES.values()), np.float32) for _ in range(2)]
    for step in range(2):
        decoded = [onebit_ef(np.concatenate([grads(r, step)[n] for n in sorted(names)]), residual[r])
                   for r in range(2)]
        total = sum(decoded) / 2
        want = dict(zip(sorted(names), np.split(total, np.cumsum([SIZES[n] for n in sorted(names)])[:-1])))
        for mode in ("eager", "function"):
            for r in range(2):
                got = cases[f"tape_{mode}"][r]["grads"][step]
                for n in names:
                    np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=1e-7,
                                               err_msg=f"{mode} {n} step {step} rank {r}")
    for mode in ("eager", "function"):
        assert cases[f"tape_{mode}"][0]["state"] == ["fused[a.bias..b.weight]"]
    keras = cases["keras_fit"]
    assert keras[0]["weights"] == keras[1]["weights"]
    assert len(keras[0]["state"]) == 1 and keras[0]["state"][0].startswith("fused[")
