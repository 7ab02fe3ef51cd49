"""The DDP hook has what the Horovod front end has (issue 35), in real torchrun processes over
Gloo (tests/ddp/parity_worker.py, two launches):

* ``scaler=`` with the user's loop ``scaler.scale(loss).backward(); scaler.step(opt);
  scaler.update()``: the weights are those of the run without a scaler that leaves the overflow
  step's batch out, bit for bit; the overflow step (rank 1's loss inf) leaves the compressor
  state and the parameters untouched on every rank and halves the scale on every rank;
* ``state_dict(gather=True)`` at 2 ranks resumed at 3: every new rank's residual is the old
  ranks' mean (float64 sum / 2, rounded to float32), so the unsent mass per rank that enters the
  average is kept; one rank's state is refused at 3 ranks, saying how to save one;
* a state built before ``init_process_group`` trains exactly as one built after it;
* ``compression="auto"`` plans every tensor at the first exchange, alike on every rank.
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest
from test_ddp import HERE, torchrun

WORKER = HERE / "ddp" / "parity_worker.py"


@pytest.fixture(scope="module")
def records() -> dict:
    with tempfile.TemporaryDirectory() as directory:
        two = torchrun(2, WORKER, ["--save", directory], timeout=300)
        three = torchrun(3, WORKER, ["--load", directory], timeout=300)
    out: dict = {}
    for r in (r for per_rank in two + three for r in per_rank):   # each rank's records
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


def test_scaler_gives_the_weights_of_the_run_without_it(records):
    for rank, r in records["scaler"].items():
        assert r["amp"] == r["plain"], f"rank {rank}: weights with scaler= differ from the run without"
        assert r["bytes_sent"] > 0
    assert records["scaler"][0]["amp"] == records["scaler"][1]["amp"]


def test_overflow_step_leaves_state_and_parameters_and_halves_the_scale(records):
    for rank, r in records["scaler"].items():
        assert r["state_kept"], f"rank {rank}: the overflow step changed the compressor state"
        assert r["params_kept"], f"rank {rank}: the overflow step changed the parameters"
        assert r["scale_after"] == r["scale_before"] / 2


def test_gathered_state_resumes_at_three_ranks_with_the_mean_kept(records):
    saved = records["saved"]
    assert saved[0]["ranks_saved"] == 2
    names = sorted(saved[0]["tensors"])
    assert any("residual" in saved[0]["tensors"][n] for n in names)
    for n in names:
        for key, mine in saved[0]["tensors"][n].items():
            old = [np.asarray(saved[r]["tensors"][n][key], np.float64) for r in (0, 1)]
            expected = ((old[0] + old[1]) / 2).astype(np.float32)
            for rank, r in records["loaded"].items():
                got = np.asarray(r["tensors"][n][key], np.float32)
                assert np.array_equal(got, expected), f"rank {rank}: {n}/{key} is not the old ranks' mean"
    after = [records["loaded"][r]["after"] for r in range(3)]
    assert after[0] == after[1] == after[2]


def test_one_ranks_state_is_refused_at_another_world_size(records):
    for r in records["loaded"].values():
        assert r["refused"] is not None and "gather=True" in r["refused"] and "2 ranks" in r["refused"]


def test_state_built_before_init_process_group(records):
    for r in records["pre_init"].values():
        assert r["early"] == r["late"]


def test_auto_plans_alike_on_every_rank(records):
    ranks = records["auto"]
    assert ranks[0]["plan"] and ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["params"] == ranks[1]["params"]
    assert ranks[0]["bytes"]["steps"] == 3 and ranks[0]["bytes"]["dense"] > 0
