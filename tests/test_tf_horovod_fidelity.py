"""Horovod drop-in fidelity for TF and Keras, under real Horovod processes (horovodrun -np 2
--gloo, one launch of tests/hvd/tf_fidelity.py): ``_compute_gradients(loss, var_list,
grad_loss=None, tape=None)`` on every Keras optimizer kind, ``PartialDistributedGradientTape``
with ``get_local_and_global_gradients``, ``PartialDistributedOptimizer``, and the tape in TF1
graph mode. References by hand in numpy, from the data the script generates.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_horovod

import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck

KERAS2 = not getattr(tf.keras, "__version__", "2").startswith("3")  # TF 2.15's tf.keras: no __version__
KINDS = ["new", "legacy"]
NO_LEGACY = "Keras 3 has no legacy optimizers (no optimizer of its own _compute_gradients)"


def c_w(r: int, k: int) -> np.ndarray:   # as tests/hvd/tf_fidelity.py
    return np.array([1.0 + r, -2.0 + 0.5 * k], np.float32)


def c_z(r: int, k: int) -> np.ndarray:
    return np.array([np.inf if (r, k) == (0, 0) else 0.5 * (r + 1) * (k + 1)], np.float32)


@pytest.fixture(scope="module")
def fidelity() -> dict:
    """case -> [rank 0's record, rank 1's]."""
    cases: dict = {}
    for r in sorted(run_horovod("tf_fidelity.py", timeout=400), key=lambda r: r["rank"]):
        cases.setdefault(r["case"], []).append(r)
    return cases


def kinds():
    return [pytest.param(k, marks=pytest.mark.skipif(k == "legacy" and not KERAS2, reason=NO_LEGACY))
            for k in KINDS]


@pytest.mark.horovod
@pytest.mark.parametrize("kind", kinds())
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("average", [True, False])
def test_compute_gradients_aggregates_as_horovod(fidelity, kind, mode, average):
    """backward_passes_per_step=2, SGD(0.5), 4 calls of _compute_gradients + apply_gradients:
    between steps the local sums come back (not applied), on every 2nd call the ranks' mean of
    the cycle's sums (or means) is returned and applied; rank 0's inf of the first cycle is
    exchanged then (z: -inf), and the second cycle restarts from zero (finite, as Horovod's
    test_grad_aggregation_with_inf_grad); iterations counts every call, the counter the cycle."""
    passes, lr = 2, 0.5
    for r, record in enumerate(fidelity[f"agg.{kind}.{mode}.{average}"]):
        w = np.zeros(2)
        for k, call in enumerate(record["calls"]):
            start = k - k % passes
            own_w = sum(c_w(r, j).astype(np.float64) for j in range(start, k + 1))
            own_z = sum(c_z(r, j).astype(np.float64) for j in range(start, k + 1))
            if (k + 1) % passes:
                gw, gz = own_w, own_z
            else:
                scale = 1.0 / passes if average else 1.0
                gw = np.mean([sum(c_w(q, j) for j in range(start, k + 1)) for q in range(2)], axis=0) * scale
                gz = np.mean([sum(c_z(q, j) for j in range(start, k + 1)) for q in range(2)], axis=0) * scale
                w = w - lr * gw
            np.testing.assert_allclose(call["gw"], gw, rtol=1e-6, err_msg=f"rank {r} call {k}")
            np.testing.assert_allclose(call["gz"], gz, rtol=1e-6, err_msg=f"rank {r} call {k}")
            np.testing.assert_allclose(call["w"], w, rtol=1e-6, err_msg=f"rank {r} call {k}")
            assert call["iterations"] == k + 1 and call["counter"] == (k + 1) % passes
        assert np.isinf(record["calls"][1]["gz"][0]) and np.isfinite(record["calls"][3]["gz"][0])


@pytest.mark.horovod
@pytest.mark.parametrize("kind", kinds())
def test_compute_gradients_of_a_tensor_loss_with_its_tape(fidelity, kind):
    """A tensor loss recorded on a persistent tape, grad_loss=3: the ranks' mean of 3 c_r,
    paired with the variable itself; without tape= a clear error."""
    for record in fidelity[f"tensor_loss.{kind}"]:
        np.testing.assert_allclose(record["grad"], 3 * (c_w(0, 0) + c_w(1, 0)) / 2, rtol=1e-6)
        assert record["same_variable"]
        assert "tape" in record["error"]


def model_gradients(r: int) -> list:
    """Hand-computed gradients of 0.5 * ||(x W1 + b1) W2 + b2 - t||^2 on rank r's data and
    weights (tests/hvd/tf_fidelity.py's model): [dW1, db1, dW2, db2]."""
    x = np.array([[1.0 + r, 2.0, -1.0], [0.5, -r, 3.0]])
    t = np.array([[1.0], [-1.0]])
    w1, b1 = np.full((3, 2), 0.1 * (r + 1)), np.full(2, 0.2)
    w2, b2 = np.full((2, 1), 0.3), np.full(1, -0.1 * r)
    h = x @ w1 + b1
    dy = h @ w2 + b2 - t
    dh = dy @ w2.T
    return [x.T @ dh, dh.sum(0), h.T @ dy, dy.sum(0)]


def expected_partial(local: set, scale: bool) -> list:
    """Per rank: the local weights' own gradient (/2 with scale_local_gradients), the others'
    mean over the 2 ranks."""
    g = [model_gradients(r) for r in range(2)]
    return [[g[r][i] / (2 if scale else 1) if i in local else (g[0][i] + g[1][i]) / 2 for i in range(4)]
            for r in range(2)]


@pytest.mark.horovod
@pytest.mark.parametrize("case,local,scale", [("list", {0, 1}, True), ("single_unscaled", {2, 3}, False)])
def test_partial_distributed_gradient_tape(fidelity, case, local, scale):
    """PartialDistributedGradientTape(local_layers=[first] / second layer alone): the local
    layer's kernel and bias keep this rank's gradient (halved, as Horovod's, unless
    scale_local_gradients=False), the others are averaged; get_local_and_global_gradients
    splits the same gradients by layer, in order."""
    expected = expected_partial(local, scale)
    for r, record in enumerate(fidelity[f"ptape.{case}"]):
        for i in range(4):
            np.testing.assert_allclose(record["grads"][i], expected[r][i], rtol=1e-5, err_msg=f"rank {r} weight {i}")
        assert [i for i, _ in record["local"]] == sorted(local)
        assert [i for i, _ in record["shared"]] == sorted(set(range(4)) - local)
        for i, g in record["local"] + record["shared"]:
            np.testing.assert_allclose(g, expected[r][i], rtol=1e-5)
    assert all("local_layers=" in rec["error"] and "allowed" in rec["error"]
               for rec in fidelity["ptape.bad_layers"])


@pytest.mark.horovod
@pytest.mark.parametrize("kind", kinds())
def test_partial_distributed_optimizer(fidelity, kind):
    """PartialDistributedOptimizer(SGD(0.5), local_layers=[first]), Horovod's
    opt._compute_gradients(loss, weights, tape=tape) then apply_gradients: the returned
    gradients as the partial tape's, the weights moved by 0.5 times them."""
    expected = expected_partial({0, 1}, True)
    for r, record in enumerate(fidelity[f"popt.{kind}"]):
        start = [np.full((3, 2), 0.1 * (r + 1)), np.full(2, 0.2), np.full((2, 1), 0.3), np.full(1, -0.1 * r)]
        for i in range(4):
            np.testing.assert_allclose(record["grads"][i], expected[r][i], rtol=1e-5)
            np.testing.assert_allclose(record["weights"][i], start[i] - 0.5 * expected[r][i], rtol=1e-5)


@pytest.mark.horovod
def test_tape_in_tf1_graph_mode(fidelity):
    """TF1 graph mode (a Session): a is exchanged (mean of c_r), b registered local (c_r / 2);
    get_local_and_global_gradients gives the same, b alone local."""
    for r, record in enumerate(fidelity["graph"]):
        ga, gb = (c_w(0, 1) + c_w(1, 1)) / 2, c_w(r, 2) / 2
        np.testing.assert_allclose(record["ga"], ga, rtol=1e-6)
        np.testing.assert_allclose(record["gb"], gb, rtol=1e-6)
        np.testing.assert_allclose(record["local"], [gb], rtol=1e-6)
        np.testing.assert_allclose(record["shared"], [ga], rtol=1e-6)
        assert record["local_is_b"] == [True]


def test_partial_wrappers_are_exported_where_horovod_has_them():
    """hvd.PartialDistributedGradientTape / horovod.keras.PartialDistributedOptimizer, and a
    bad local_layers named in the error before anything is built."""
    assert hvc.PartialDistributedGradientTape.__name__ == "PartialDistributedGradientTape"
    assert hvck.PartialDistributedOptimizer.__name__ == "PartialDistributedOptimizer"
    with pytest.raises(ValueError, match=r"local_layers=3: allowed: None, a tf.keras.layers.Layer"):
        hvc.PartialDistributedGradientTape(tf.GradientTape(), local_layers=3)
    with pytest.raises(ValueError, match=r"local_layers='dense': allowed"):
        hvck.PartialDistributedOptimizer(tf.keras.optimizers.SGD(0.1), local_layers="dense")
