"""Two-level compression under real Horovod processes (nodes emulated on one machine with
ranks_per_node, process sets registered at hvd.init by node_process_sets): the torch optimizer at
4 ranks (2 nodes x 2) against tests/test_two_level.py's numpy reference and against the flat
exchange (16 ranks, 4 x 4: tests/test_scale16_horovod.py)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import run_horovod, run_horovod_failing
from test_two_level import gradient, reference_fp16_onebit

pytestmark = pytest.mark.horovod


def integer_average(size: int, n: int, steps: int) -> np.ndarray:
    """w after SGD lr 1 from 0 on the average of integer-valued gradients (exact in float32)."""
    w = np.zeros(n, np.float32)
    for step in range(steps):
        w = w - sum(gradient(r, n, 100 * step, True) for r in range(size)) / np.float32(size)
    return w


def fp16_onebit_weights() -> np.ndarray:
    """The scripts' weights after 3 SGD steps (lr 1, from 0) of FP16 inside + EF(OneBit) across,
    2 nodes of 2, 999 elements, in numpy."""
    w = np.zeros(999, np.float32)
    for update in reference_fp16_onebit(2, 2, 999, 3):
        w = w - update
    return w


@pytest.fixture(scope="module")
def two_by_two() -> dict:
    """One launch of 2 nodes x 2: the reference part, then the slow-node part."""
    results = run_horovod("torch_two_level.py", np=4, args=["reference,late"], timeout=420)
    return {part: sorted((r for r in results if r["part"] == part), key=lambda r: r["rank"])
            for part in ("reference", "late")}


def test_torch_two_level_at_2_nodes_of_2_matches_numpy_and_the_flat_allreduce(two_by_two):
    results = two_by_two["reference"]
    assert len(results) == 4
    w = fp16_onebit_weights()
    for r in results:
        np.testing.assert_allclose(r["w"], w, rtol=1e-5, atol=1e-6)
        # NoCompression on both levels: the flat allreduce's bits (integer-valued gradients)
        assert r["exact"] == r["flat"] == integer_average(4, 1001, 2).tolist()
        assert (r["inter_node"], r["dense"]) == (-(-500 // 8) + 4, 4 * 999)  # a 1-bit shard of 500
        assert r["dgc_state"] == ["cross.momentum", "cross.velocity"]
    for key in ("w", "dgc_w"):
        assert all(r[key] == results[0][key] for r in results)


def test_a_slow_node_finishes_its_last_step_after_the_other_node_exits(two_by_two):
    """Node 1 exits while node 0 (delayed) has its last node-local all-gather to run: the exit
    barrier (hvdcompress.transport.exit_guard) lets it finish; every rank has the flat result."""
    results = two_by_two["late"]
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    for r in results:
        assert r["w"] == integer_average(4, 1001, 2).tolist()


def test_without_the_exit_barrier_the_slow_node_is_shut_down():
    """The failure the barrier prevents, shown with it turned off: node 0's last step fails."""
    out = run_horovod_failing("torch_two_level.py", np=4, args=["late"], timeout=300,
                              env={"HVDCOMPRESS_EXIT_WAIT_SECONDS": "0"})
    assert "Horovod has been shut down" in out or "has not been registered" in out, out[-3000:]


def test_tf_tape_and_keras_two_level_at_2_nodes_of_2():
    results = run_horovod("tf_two_level.py", np=4, timeout=420)
    assert len(results) == 4
    w = fp16_onebit_weights()
    for r in results:
        np.testing.assert_allclose(r["w"], w, rtol=1e-5, atol=1e-6)
        assert r["exact"] == r["flat"] == integer_average(4, 1001, 2).tolist()
    assert all(r["w"] == results[0]["w"] for r in results)
