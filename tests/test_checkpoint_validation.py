"""Checkpoints are checked whole before anything changes (hvdcompress.state.store.check / prepare):
the format version, the compressor tree and counters, every tensor's name, shape and dtype, the
sizes of the per-rank state, the world size, the entries a checkpoint must hold. A refused
load raises a ValueError naming the entry, what it holds and what was expected, and leaves the
optimizer (the wrapped one's state included) and the compressor exactly as they were.

The cases are one table (tests/checkpoint_cases.py), for the Horovod torch optimizer here (a load
is local: one process, as tests/test_torch_arguments.py) and for the DDP hook at 2 ranks
(tests/ddp/validation_worker.py, one launch).
"""
from __future__ import annotations

import copy

import horovod.torch as hvd
import pytest
import torch
from checkpoint_cases import NEWER_ENTRIES, OTHER_WIDTH, WIDTH, model, refusals, same, train, without
from test_ddp import HERE, torchrun

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
REFUSED = ["dgc_into_topk", "other_widths", "state_shape", "no_tensors", "no_compressor", "world",
           "version", "not_a_dict"]


def topk() -> hc.Compressor:
    return hc.ErrorFeedback(hc.TopK(0.25))


def trained(compression: hc.Compressor, width: int = WIDTH, steps: int = 2):
    net = model(width)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=net.named_parameters(), compression=compression)
    train(net, net, opt, 0, range(steps))
    return opt


@pytest.fixture(scope="module")
def saved() -> dict:
    """The optimizer checkpoints the cases are cut from: top-k + EF after one step (its lr set
    to 0.5, so a half-done load shows), on the wide model, and DGC's."""
    earlier = trained(topk(), steps=1).state_dict()
    earlier["param_groups"][0]["lr"] = 0.5
    return {"earlier": earlier, "own": trained(topk()).state_dict()["hvdcompress"],
            "wide": trained(topk(), OTHER_WIDTH).state_dict()["hvdcompress"],
            "dgc": trained(hc.DGC(0.5, min_numel=1)).state_dict()["hvdcompress"]}


def refuse(opt, checkpoint: dict, expected: str) -> None:
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError) as refused:
        opt.load_state_dict(checkpoint)
    assert expected in str(refused.value)
    assert same(opt.state_dict(), before), "a refused load changed the optimizer or the compressor"
    assert opt.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("case", REFUSED)
def test_horovod_optimizer_refuses_the_whole_checkpoint(saved, case):
    own, expected = refusals(saved["own"], saved["wide"], saved["dgc"])[case]
    refuse(trained(topk()), {**saved["earlier"], "hvdcompress": own}, expected)


def test_horovod_optimizer_refuses_dgc_state_in_powersgd(saved):
    refuse(trained(hc.PowerSGD()), {**saved["earlier"], "hvdcompress": saved["dgc"]}, "and this run has PowerSGD(")


def test_a_checkpoint_without_version_loads_as_version_zero(saved):
    full = {**saved["earlier"], "hvdcompress": saved["own"]}
    new, old = trained(topk(), steps=0), trained(topk(), steps=0)
    new.load_state_dict(full)
    old.load_state_dict({**full, "hvdcompress": without(saved["own"], *NEWER_ENTRIES)})
    assert same(new.state_dict(), old.state_dict())
    assert same(new.state_dict()["hvdcompress"]["tensors"], saved["own"]["tensors"])
    assert new.param_groups[0]["lr"] == 0.5


def test_a_checkpoint_names_its_version_and_run():
    own = trained(topk(), steps=1).state_dict()["hvdcompress"]
    assert own["version"] == 1 and own["compression"] == "ErrorFeedback(TopK(k=0.25), ef='vanilla')"
    assert own["params"] == [("0.bias", (WIDTH,), "torch.float32"), ("0.weight", (WIDTH, 8), "torch.float32"),
                             ("1.bias", (2,), "torch.float32"), ("1.weight", (2, WIDTH), "torch.float32")]


@pytest.fixture(scope="module")
def ddp() -> dict:
    """Case -> rank -> the record of tests/ddp/validation_worker.py's checkpoint part."""
    out: dict = {}
    for per_rank in torchrun(2, HERE / "ddp" / "validation_worker.py", ["checkpoint"], timeout=240):
        for record in per_rank:
            out.setdefault(record["case"], {})[record["rank"]] = record
    return out


@pytest.mark.parametrize("case", [*REFUSED, "dgc_into_powersgd"])
def test_ddp_hook_refuses_the_whole_checkpoint(ddp, case):
    for record in ddp[case].values():
        assert record["error"] is not None and record["expected"] in record["error"], record
        assert record["unchanged"], f"{case}: a refused load changed the hook's state"
    assert len(ddp[case]) == 2


def test_ddp_hook_loads_a_version_zero_checkpoint(ddp):
    for record in ddp["version_zero"].values():
        assert record["same_as_version_one"] and record["loaded"], record
