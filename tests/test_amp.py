"""Mixed precision with a loss scaler (hvdcompress.step.loss_scale; issue 24 item 1).

In one process: :class:`OverflowGuard` puts a state back exactly (tensors in place, Python
values, keys the step added), and the torch optimizer's ``scaler=`` argument and its misuse
errors. Under horovodrun (tests/hvd/torch_amp.py, 2 ranks, one launch): with ``scaler=`` the
weights after 30 autocast steps, the loss scale doubling every 3 steps, equal those of the run
without a scaler (bit for bit in bfloat16, within float16 rounding in float16) for every
compressor that carries state, where Horovod's AMP pattern without ``scaler=`` ends 15-80% of
the training distance away and warns once; an overflow on one rank leaves the compressor state
exactly as it was, the weights unmoved and the scale halved, on both ranks alike, and the run
then equals the plain run without that step's batches. The TensorFlow/Keras cases are in
tests/test_tf_state_change.py.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch
from conftest import run_horovod

import hvdcompress as hc
import hvdcompress.torch as hvc
from hvdcompress.ops.torch_ops import TorchOps
from hvdcompress.step.loss_scale import OverflowGuard
from hvdcompress.transport.collectives import Collectives

hvd.init()
STATEFUL = ("onebit_ef", "topk_ef", "dgc", "powersgd", "momentum_topk_ef", "frozen_adam", "fused_onebit_ef")
FINAL_SCALE = {"bf16": 2.0 ** 20, "fp16": 2.0 ** 12}   # 2^INIT doubled 10 times (tests/hvd/torch_amp.py)


class OneRank(Collectives):
    """The collectives of a single rank: the sum is the tensor itself."""
    world, rank = 1, 0

    def allreduce(self, tensors, tag):
        return list(tensors)

    def allgather(self, tensors, tag):
        return list(tensors)

    def alltoall(self, tensors, tag):
        return list(tensors)

    def wait(self, handle):
        return handle


def _copy(value, buffer):
    return buffer.copy_(value) if buffer is not None else value.clone()


def _step(state: dict) -> None:
    """What a compressor's step may do: update in place, replace, add a key, count."""
    state["residual"].add_(1.0)
    state["momentum"] = state["momentum"] * 3.0
    state["new"] = torch.ones(2)
    state["step"] += 1


@pytest.mark.parametrize("overflow", [True, False])
def test_guard_restores_exactly_on_overflow(overflow):
    guard = OverflowGuard(TorchOps(), _copy)
    residual = torch.arange(4.0)
    state = {"residual": residual, "momentum": torch.full((2, 2), 2.0), "step": 5}
    for _ in range(2):   # twice: the second step reuses the buffers of the first
        before = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
        guard.save("w", state)
        guard.save("w", state)   # a second save in the step keeps the first copy
        _step(state)
        assert guard.settle(OneRank(), guard.launch(OneRank(), torch.tensor([float(overflow)]))) is overflow
        if overflow:
            assert state.keys() == before.keys() and state["step"] == before["step"]
            assert all(torch.equal(state[k], before[k]) for k in ("residual", "momentum"))
            assert state["residual"] is residual   # written back in place
        else:
            assert state["step"] == before["step"] + 1 and torch.equal(state["new"], torch.ones(2))
            del state["new"]


def _model_opt(**kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kw)
    return model, opt


def test_scaler_argument_is_checked():
    with pytest.raises(ValueError, match=r"scaler='yes': allowed: None or a torch\.amp\.grad_scaler\.GradScaler"):
        _model_opt(compression=hc.DGC(0.5, min_numel=0), scaler="yes")


def test_unscale_before_the_gradients_is_refused():
    """scaler.unscale_ before the optimizer saw the gradients: an error naming the fix."""
    scaler = torch.amp.GradScaler("cpu")
    model, opt = _model_opt(compression=hc.ErrorFeedback(hc.TopK(2)), scaler=scaler,
                            backward_passes_per_step=2)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()   # first of 2 passes: no hook yet
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"drop scaler.unscale_\(optimizer\)"):
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()


def test_scaler_step_one_rank_matches_plain_and_skips_overflow():
    """One rank: scaler= gives the weights of the run without a scaler (the scale is a power of
    two), and a poisoned step changes neither the weights nor the error-feedback residual."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    plain, opt = _model_opt(compression=hc.ErrorFeedback(hc.TopK(2)))
    for _ in range(5):
        opt.zero_grad()
        plain(x).pow(2).sum().backward()
        opt.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=1)
    model, opt = _model_opt(compression=hc.ErrorFeedback(hc.TopK(2)), scaler=scaler)
    for step in range(6):
        opt.zero_grad()
        loss = model(x).pow(2).sum() * (float("inf") if step == 3 else 1.0)
        residual = {n: s["residual"].clone() for n, s in opt._tensor_state.items() if "residual" in s}
        weights = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step == 3:
            assert all(torch.equal(residual[n], opt._tensor_state[n]["residual"]) for n in residual)
            assert all(torch.equal(a, p) for a, p in zip(weights, model.parameters()))
    assert scaler.get_scale() == 2.0 ** (12 + 5 - 1)   # doubled at each finite step, halved at the overflow
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters()))


@pytest.fixture(scope="module")
def records():
    out: dict = {}
    for r in run_horovod("torch_amp.py", np=2, timeout=600):
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


@pytest.mark.horovod
def test_ranks_agree(records):
    for case, ranks in records.items():
        assert ranks.keys() == {0, 1}, case
        assert ranks[0]["checksum"] == ranks[1]["checksum"], case
        assert ranks[0]["scale"] == ranks[1]["scale"], case


@pytest.mark.horovod
@pytest.mark.parametrize("case", ("none",) + STATEFUL)
def test_bf16_scaler_equals_the_unscaled_run(records, case):
    """bfloat16 autocast: scaling by 2^k is exact, so with scaler= the weights are the plain run's
    bit for bit; without it, the state built under changing scales puts them far off."""
    for mode in ("scaler", "sync"):
        for r in records.get(f"{mode}_{case}_bf16", {}).values():
            assert r["gap"] == 0.0 and r["warnings"] == [] and r["scale"] == FINAL_SCALE["bf16"], r
    horovod = records[f"horovod_{case}_bf16"][0]
    if case == "none":
        assert horovod["gap"] == 0.0 and horovod["warnings"] == []
    else:
        assert horovod["gap"] > 0.1, horovod


@pytest.mark.horovod
@pytest.mark.parametrize("case", ("onebit_ef", "dgc"))
def test_fp16_scaler_within_fp16_rounding(records, case):
    """float16 autocast: s·g rounds differently in fp16 at different scales (no compression: a
    gap of ~1e-3), so the scaler= run is within that rounding, amplified by sign flips for 1-bit,
    of the plain one: tens of times closer than Horovod's pattern."""
    none = records["scaler_none_fp16"][0]["gap"]
    scaled, horovod = records[f"scaler_{case}_fp16"][0], records[f"horovod_{case}_fp16"][0]
    assert 0 < none < 0.01
    assert scaled["gap"] < 0.05 and scaled["gap"] * 20 < horovod["gap"], (scaled, horovod)
    assert scaled["scale"] == FINAL_SCALE["fp16"]   # no step overflowed


@pytest.mark.horovod
@pytest.mark.parametrize("case", STATEFUL)
def test_horovod_pattern_warns_once(records, case):
    for r in records[f"horovod_{case}_bf16"].values():
        assert len(r["warnings"]) == 1, r["warnings"]
        assert "Pass scaler=<your GradScaler>" in r["warnings"][0]


@pytest.mark.horovod
@pytest.mark.parametrize("case", ("none",) + STATEFUL)
def test_overflow_on_one_rank_leaves_state_and_skips_everywhere(records, case):
    for r in records[f"overflow_{case}"].values():
        assert r["same_state"] and not r["weights_moved"], r
        assert r["scale_after"] == r["scale_before"] / 2, r
        assert r["gap"] == 0.0, r   # as if the step's batches never were
        assert r["warnings"] == []
