"""The DDP communication hook (hvdcompress.torch.ddp) in real torchrun processes over Gloo.

Each launch runs tests/ddp/worker.py on N ranks (1, 2 and 4) for many
compression cases at once (a launch costs seconds, a case a fraction of one); every rank
writes its records to its own file. Against them:

* replicas: every rank ends with the same parameter bits;
* the Horovod front end: the parameters equal those of tests/ddp/cases.py's ``reference``, the
  front end's per-tensor exchange, momentum or Adam take-over and clipping run on the
  in-process simulator (tests/simulator.py) with the same model, batches and compressor: every
  registered compressor, the decorators, FrozenAdam, two-level compression, DDP over two
  process groups. Bit for bit wherever the sum is the same float operations: at 1 and 2 ranks
  always (an allreduce adds two numbers, which commutes; allgathered payloads are summed by the
  engine in rank order), at 4 ranks for the per-rank payloads; a 4-rank float allreduce (Gloo's
  ring order against the simulator's rank order) to float rounding. The reference trains on the
  gradients each rank reports (its own backward checked to float rounding against them) and
  computes on cases.THREADS threads per simulated rank, as the ranks do: nothing it compares
  bit for bit depends on the thread count or BLAS path of the pytest process (issue 35);
* DDP's bucket rebuild after the first iteration (one bucket, then two) keeps the state;
* a checkpoint taken halfway (model, optimizer, hook state) resumes on the same bits;
* the replica check raises on every rank when one rank's parameter differs;
* the collectives adapter on payloads no compressor produces together (empty, mixed, 2-D);
* examples/ddp_train.py trains.

16 ranks: in the 16-rank Horovod launch (tests/test_scale16_horovod.py), whose processes run
the same worker after their Horovod part (16 imports of torch are most of a launch's time here).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zygote
from hvdrun import RESULTS_ENV, read_results
from simulator import run_nodes, run_ranks

import hvdcompress as hc
from hvdcompress.torch import ddp

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "ddp"))
from cases import CASES, RANKS_PER_NODE, REGISTRY, THREADS, build_model, decode, flat_params, reference  # noqa: E402

STEPS = 4
TWO = ["none", "fp16", "int8", "onebit_ef", "topk_ef", "dgc", "powersgd", "csc", "momentum_nesterov",
       "topk_ef_clip", "fp16_clip", "frozen_adam", "frozen_adam_momentum", "replicas_checked",
       "fused_onebit_ef", "fused_dgc", "fused_frozen_adam",
       *REGISTRY, "replicas_differ"]   # last: its backward raises
RESUME = ["dgc", "powersgd", "topk_ef", "frozen_adam", "fused_onebit_ef"]
ONE = ["int8", "onebit_ef"]   # a payload's bytes at an unaligned offset of the gathered buffer
FOUR = ["none", "int8", "onebit_ef", "topk_ef", "dgc", "powersgd", "two_level_dgc", "halves_onebit_ef"]
# no float allreduce of more than two numbers (two-level: the node's reduce-scatter is an
# all-to-all summed in rank order, DGC's allreduce between the 2 nodes adds two)
EXACT_AT_FOUR = ["int8", "onebit_ef", "topk_ef", "two_level_dgc", "halves_onebit_ef"]


def torchrun(np_: int, script: Path, args: list, timeout: float = 180) -> list:
    """``script`` on ``np_`` ranks (torchrun --standalone: a free port of its own); each rank's
    records. A failure or a time-out fails the test with the launch's output (with the Python
    stacks of a rank that aborts, PYTHONFAULTHANDLER, and of every rank 10 s before a time-out)."""
    with tempfile.TemporaryDirectory() as results:
        log_path = Path(results) / "launch.log"
        env = {**os.environ, RESULTS_ENV: results, "PYTHONPATH": str(HERE.parent),
               "OMP_NUM_THREADS": str(THREADS), "PYTHONWARNINGS": "ignore", "PYTHONFAULTHANDLER": "1",
               zygote.STACKS_AT_ENV: str(time.time() + timeout - 10)}   # a hang shows where it waits
        argv, env = zygote.command(script, list(args), env)   # the ranks, and torchrun itself, forked
        launcher, env = zygote.module_command("torch.distributed.run", ["--standalone", f"--nproc_per_node={np_}",
                                                                         *argv], env)
        command = [sys.executable, *launcher]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        if code != 0:
            pytest.fail(f"torchrun -np {np_} {'timed out' if code is None else f'exited {code}'}:\n"
                        f"{log_path.read_text()[-6000:]}", pytrace=False)
        return read_results(results, np_)


def run_cases(np_: int, cases: list, resume: list = (), steps: int = STEPS, timeout: float = 180) -> dict:
    """tests/ddp/worker.py's ``cases`` on ``np_`` ranks in one launch: case -> each rank's record."""
    per_rank = torchrun(np_, HERE / "ddp" / "worker.py", ["--cases", ",".join(cases), "--steps",
                                                          str(steps), "--resume", ",".join(resume)], timeout)
    cases = ["collectives", *cases]
    assert [[record["case"] for record in records] for records in per_rank] == [cases] * np_, per_rank
    return {case: [records[i] for records in per_rank] for i, case in enumerate(cases)}


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    return run_cases(2, TWO, RESUME)


@pytest.fixture(scope="module")
def one_rank() -> dict:
    return run_cases(1, ONE)


@pytest.fixture(scope="module")
def four_ranks() -> dict:
    return run_cases(4, FOUR)


def params(record: dict) -> dict:
    return {name: np.array(values, dtype=np.float32) for name, values in record["params"].items()}


def rank_grads(record: dict) -> list:
    """The local gradients a rank's hook was handed: per step, name -> flat tensor."""
    return [{name: decode(text) for name, text in step.items()} for step in record["grads"]]


def simulated(case: str, records: list, world: int, steps: int) -> list:
    """Each simulated rank's parameters under the Horovod front end's exchange, rank r trained
    on the gradients of ``records[r]`` (the launched rank r's), on THREADS threads per rank."""
    by_rank = {record["rank"]: record for record in records}
    grads = [rank_grads(by_rank[r]) for r in range(world)]
    if CASES[case].intra_node is not None:
        return run_nodes(world // RANKS_PER_NODE, RANKS_PER_NODE,
                         lambda comm, node, cross: reference(CASES[case], comm, steps, node, cross,
                                                             rank_grads=grads[comm.rank]),
                         threads=THREADS)
    return run_ranks(world, lambda comm: reference(CASES[case], comm, steps, rank_grads=grads[comm.rank]),
                     threads=THREADS)


def assert_same_bits(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    for name in got:
        a, b = np.asarray(got[name], np.float32), np.asarray(want[name], np.float32)
        assert np.array_equal(a, b), f"{what}: {name} differs (max {np.abs(a - b).max():.3g})"


def check_replicas_and_reference(records: list, case: str, exact: bool, steps: int = STEPS) -> None:
    """Every rank's parameters the same bits; rank 0's those of the simulated Horovod front end
    (``exact``) or within float rounding of them."""
    for record in records[1:]:
        assert_same_bits(params(record), params(records[0]), f"{case}: rank {record['rank']} vs 0")
    # halves: two groups of P/2 ranks, each the same training as P/2 ranks alone (the first
    # group: ranks 0..P/2-1, their group ranks the same numbers)
    want = simulated(case, records, len(records) // (2 if CASES[case].halves else 1), steps)[0]
    got = params(records[0])
    if exact:
        assert_same_bits(got, want, f"{case} vs the Horovod front end")
    else:
        for name in got:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{case}: {name}")
    if case not in REGISTRY:  # defaults may send nothing in 4 steps (twobit's threshold)
        start = params({"params": flat_params(build_model())})
        assert any(not np.array_equal(got[n], start[n]) for n in got), f"{case}: parameters did not move"


@pytest.mark.parametrize("case", [c for c in TWO if CASES[c].perturb_at is None])
def test_two_ranks_equal_the_horovod_front_end(two_ranks, case):
    check_replicas_and_reference(two_ranks[case], case, exact=True)


@pytest.mark.parametrize("case", ONE)
def test_one_rank(one_rank, case):
    check_replicas_and_reference(one_rank[case], case, exact=True)


@pytest.mark.parametrize("case", FOUR)
def test_four_ranks(four_ranks, case):
    check_replicas_and_reference(four_ranks[case], case, exact=case in EXACT_AT_FOUR)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_collectives_adapter(one_rank, two_ranks, four_ranks, world):
    """Sizes that differ per rank, empty tensors, mixed dtypes, 2-D tensors: each output as
    Horovod's collectives would give it (tests/ddp/worker.py's ``collectives``)."""
    ranks = range(world)
    for record in {1: one_rank, 2: two_ranks, 4: four_ranks}[world]["collectives"]:
        r = record["rank"]
        assert record["allgather"] == [
            ["torch.int16", [sum(q + 1 for q in ranks)], [i for q in ranks for i in range(q + 1)]],
            ["torch.float32", [world // 2], [float(q) for q in ranks if q % 2]],
            ["torch.uint8", [2 * world, 3], [q for q in ranks for _ in range(6)]]]
        assert record["allgather_empty"] == [["torch.float32", [0], []]]
        assert record["allreduce"] == [["torch.float16", [3], [sum(0.5 + q for q in ranks)] * 3],
                                       ["torch.float32", [2, 2], [float(sum(ranks))] * 4]]
        assert record["alltoall"] == [["torch.int16", [2 * world],
                                       [2 * r + i + 100 * q for q in ranks for i in range(2)]]]
        assert record["pairs_take_turns"] is True   # a gloo group: compression="auto" plans for it


def test_state_survives_the_bucket_rebuild(two_ranks):
    """One bucket in the first iteration, two after DDP's rebuild; each step covers every
    parameter once (the reference equality above shows the state went along)."""
    layouts = two_ranks["dgc"][0]["layouts"]
    assert len(layouts[0]) == 4 and len(layouts[1]) == 2 and len(layouts[2]) == 2
    assert sorted(layouts[1] + layouts[2]) == sorted(layouts[0])
    assert len(layouts) == 1 + 2 * (STEPS - 1)


@pytest.mark.parametrize("case", RESUME)
def test_checkpoint_resumes_on_the_same_bits(two_ranks, case):
    for record in two_ranks[case]:
        assert_same_bits(record["resumed"], record["params"], f"{case} resumed, rank {record['rank']}")
        assert len(record["resumed_layouts"][0]) == 4   # the resumed model rebuilt its buckets too


@pytest.mark.parametrize("case", ["fused_onebit_ef", "fused_dgc", "fused_frozen_adam"])
def test_fused_cases_keep_one_bucket_state_across_ddp_buckets(two_ranks, case):
    """fusion= cuts by name, not by DDP's (rebuilt) buckets: the model's four parameters are one
    fused bucket, whose state the hook keeps (FrozenAdam's moments stay per parameter)."""
    for record in two_ranks[case]:
        assert [n for n in record["states"] if n.startswith("fused[")] == ["fused[body.bias..head.weight]"]


def test_replica_check_names_the_parameter_on_every_rank(two_ranks):
    """Rank 1 changed head.bias before step 2: the check before that step's exchange raises on
    both ranks (one gathered table), naming the parameter; without the change it stays quiet
    (replicas_checked is among the cases equal to the reference)."""
    for record in two_ranks["replicas_differ"]:
        assert "replicas differ at step 3: parameter 'head.bias'" in record["mismatch"], record.get("mismatch")


def test_bytes(two_ranks):
    none, dgc, onebit = (two_ranks[c][0] for c in ("none", "dgc", "onebit_ef"))
    assert none["sent_bytes"] == none["dense_bytes"] == STEPS * 4 * sum(map(len, none["params"].values()))
    assert dgc["sent_bytes"] < dgc["dense_bytes"] / 5
    assert onebit["sent_bytes"] < onebit["dense_bytes"] / 20


def test_example_trains_with_dgc():
    """examples/ddp_train.py as the README runs it, shorter: both ranks end with the same
    model, which learned, and DGC sent less than dense."""
    per_rank = torchrun(2, HERE.parent / "examples" / "ddp_train.py",
                        ["--compression", "dgc", "--epochs", "2", "--hidden", "256", "--warmup-epochs", "1"])
    first, second = (records[0] for records in per_rank)
    assert first["param_checksum"] == second["param_checksum"]
    assert first["accuracy"] > 0.5
    assert first["sent_bytes"] < first["dense_bytes"]


# ---- errors that need no process group ----------------------------------------------------------
def test_frozen_adam_without_the_optimizer_is_refused():
    with pytest.raises(ValueError, match="FrozenAdam replaces the optimizer's step; pass optimizer="):
        ddp.CompressionState(compression=hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit())))


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="collective='ring'"):
        ddp.CompressionState(compression=hc.Int8(), collective="ring")
    with pytest.raises(ValueError, match="intra_node=.*process_group="):
        ddp.CompressionState(process_group=object(), intra_node=hc.FP16())
    with pytest.raises(ValueError, match="clip_grad_norm=-1"):
        ddp.CompressionState(clip_grad_norm=-1)


def test_the_hook_does_not_import_horovod():
    """DDP users need not install Horovod: hvdcompress.torch loads the Horovod front end only when
    one of its names is used."""
    code = ("import sys, hvdcompress.torch.ddp, hvdcompress.torch as hvc\n"
            "assert not [m for m in sys.modules if m.startswith('horovod')], 'horovod imported'\n"
            "hvc.DistributedOptimizer\n"
            "assert 'horovod.torch' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
