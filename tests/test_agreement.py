"""The rank agreement on everything that must agree (hvdcompress.step.agreement, the settings of
hvdcompress.step.options.Options.agreement): a rank that differs in the compressor tree, the clip,
the predivide, sparse-as-dense, fusion, the collective, the op, the accumulation or its tensors
gets one ValueError on every rank, the same, naming the setting and each rank's value, before
the first collective that could hang.

Real processes, every case in one launch per front end: 2 Horovod ranks
(tests/hvd/torch_agreement.py) and 2 torch.distributed ranks over Gloo for the DDP hook
(tests/ddp/validation_worker.py). A disagreement the check missed hangs or drifts there; the
launches' time limits turn a hang into a failure with the launch's output.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import run_horovod
from test_ddp import HERE, torchrun

import hvdcompress as hc
from hvdcompress.step.agreement import disagreement
from hvdcompress.step.options import parse_options

#: case -> the parts of the message every rank must raise
EXPECTED = {
    "ef_fp16_vs_bf16": ("ranks disagree on compression: rank index 0: ErrorFeedback(FP16(), ef='vanilla'); "
                        "rank index 1: ErrorFeedback(BF16(), ef='vanilla')",),
    "ef_none_vs_fp16": ("ranks disagree on compression: rank index 0: ErrorFeedback(NoCompression(), ef='vanilla'); "
                        "rank index 1: ErrorFeedback(FP16(), ef='vanilla')",),
    "clip_one_rank": ("ranks disagree on clip_grad_norm: rank index 0: 1.0; rank index 1: None",),
    "predivide": ("ranks disagree on gradient_predivide_factor: rank index 0: 2.0; rank index 1: 1.0",),
    "sparse_as_dense": ("ranks disagree on sparse_as_dense: rank index 0: True; rank index 1: False",),
    "fusion": ("ranks disagree on fusion: rank index 0: ", "; rank index 1: None"),
    "collective": ("ranks disagree on collective: rank index 0: alltoall; rank index 1: allgather",),
    "op": ("ranks disagree on op: rank index 0: Average; rank index 1: Sum",),
    "backward_passes_per_step": ("ranks disagree on backward_passes_per_step: rank index 0: 1; rank index 1: 2",),
    "shape": ("ranks disagree on params: (name, shape, dtype) rank index 1 has ('0.bias', (5,), 'torch.float32')",
              "where rank index 0 has ('0.bias', (3,), 'torch.float32')"),
    "dtype": ("ranks disagree on params: (name, shape, dtype) rank index 1 has ('0.bias', (3,), 'torch.float64')",
              "where rank index 0 has ('0.bias', (3,), 'torch.float32')"),
}
DDP_CASES = ["ef_fp16_vs_bf16", "ef_none_vs_fp16", "clip_one_rank", "fusion", "collective"]


def by_case(records: list) -> dict:
    out: dict = {}
    for record in records:
        out.setdefault(record["case"], {})[record["rank"]] = record
    return out


@pytest.fixture(scope="module")
def horovod() -> dict:
    return by_case(run_horovod("torch_agreement.py", np=2, timeout=180))


@pytest.fixture(scope="module")
def ddp() -> dict:
    return by_case(r for records in torchrun(2, HERE / "ddp" / "validation_worker.py", ["agreement"], timeout=180)
                   for r in records)


def check_refused(cases: dict, case: str, prefix: str) -> None:
    errors = [cases[case][rank]["error"] for rank in (0, 1)]
    assert errors[0] is not None and errors[0] == errors[1], (case, errors)   # one error, on every rank
    assert errors[0].startswith(prefix), errors[0]
    for part in EXPECTED[case]:
        assert part in errors[0], (case, part, errors[0])


@pytest.mark.horovod
@pytest.mark.parametrize("case", list(EXPECTED))
def test_horovod_optimizer_refuses_each_disagreement_on_every_rank(horovod, case):
    check_refused(horovod, case, "hvdcompress.torch.DistributedOptimizer: ranks disagree on ")


@pytest.mark.parametrize("case", DDP_CASES)
def test_ddp_hook_refuses_each_disagreement_on_every_rank(ddp, case):
    check_refused(ddp, case, "ValueError: hvdcompress.torch.ddp.CompressionState: ranks disagree on ")


def check_agreed(cases: dict) -> None:
    same = cases["same"]
    assert [same[r]["error"] for r in (0, 1)] == [None, None], same
    assert same[0]["params"] == same[1]["params"]


@pytest.mark.horovod
def test_horovod_ranks_that_agree_train_alike(horovod):
    check_agreed(horovod)


def test_ddp_ranks_that_agree_train_alike(ddp):
    check_agreed(ddp)


def test_reprs_show_the_whole_tree():
    assert repr(hc.ErrorFeedback(hc.FP16())) == "ErrorFeedback(FP16(), ef='vanilla')"
    assert repr(hc.Momentum(hc.TopK(0.01), nesterov=True)) == "Momentum(TopK(k=0.01), momentum='nesterov', mu=None)"
    assert repr(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2)).startswith(
        "FrozenAdam(ErrorFeedback(OneBit(scale=True, chunk='rows'), ef='vanilla'), adam='frozen', freeze_steps=2")
    trees = [hc.ErrorFeedback(c) for c in (hc.FP16(), hc.BF16(), hc.NoCompression(), hc.TopK(0.01), hc.TopK(0.02))]
    assert len({repr(t) for t in trees}) == len(trees)
    assert hc.Momentum(hc.TopK(0.01)).config() == {"momentum": "plain", "mu": None, "k": 0.01}   # flat, as before


def agreement(**arguments) -> dict:
    options = parse_options(**{"op": "avg", **arguments}, average_op="avg", sum_op="sum")
    return options.agreement(SimpleNamespace(collective=options.collective, comm=SimpleNamespace(world=2)))


@pytest.mark.parametrize("setting,changed", [
    ("compression", {"compression": hc.ErrorFeedback(hc.BF16())}),
    ("clip_grad_norm", {"clip_grad_norm": 1.0}),
    ("gradient_predivide_factor", {"gradient_predivide_factor": 2.0}),
    ("sparse_as_dense", {"sparse_as_dense": True}),
    ("fusion", {"fusion": True}),
    ("backward_passes_per_step", {"backward_passes_per_step": 2}),
    ("op", {"op": "sum"}),
    ("groups", {"groups": 2}),
    ("check_replicas", {"check_replicas": 5}),
])
def test_every_front_end_compares_each_setting(setting, changed):
    """The settings come from one place (Options.agreement), which the Horovod optimizer, the
    DDP and FSDP hooks, the TF tape and the Keras optimizer all compare through the step driver."""
    base = agreement(compression=hc.ErrorFeedback(hc.FP16()))
    other = agreement(**{"compression": hc.ErrorFeedback(hc.FP16()), **changed})
    assert [key for key in base if base[key] != other[key]] == [setting]


def test_the_message_lists_each_ranks_value_and_groups_equal_ones():
    everyone = [{"params": [("w", (2,), "f32")], "clip_grad_norm": c} for c in (None, 1.0, None)]
    assert disagreement(everyone) == "ranks disagree on clip_grad_norm: rank indices 0, 2: None; rank index 1: 1.0"
    assert disagreement([{"a": 1}, {"a": 1, "b": 2}]) == "ranks disagree on b: rank index 0: <missing>; rank index 1: 2"
    assert disagreement([{"a": 1}, {"a": 1}]) is None
