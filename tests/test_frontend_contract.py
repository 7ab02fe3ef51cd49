"""The front-end contract (hvdcompress.step.frontend): one step sequence that the front ends fill.

* The toy front end (tests/toy_front_end.py, plain torch tensors over the simulator) is under
  150 lines and is what tests/test_ddp.py compares the DDP hook's launched ranks with, bit for
  bit, on every DDP case; here it is checked against numpy on two simulated ranks.
* The torch front ends (the Horovod optimizer, the DDP hook, HSDP, FSDP's reduce-scatter) run
  the contract's sequence, not one of their own: they subclass it and override none of its steps.
* The order: with a compressor that carries state, the local clip runs at ``wait()`` over every
  gradient in name order before anything is compressed or sent; without, each gradient is
  sent at ``ready()`` and Horovod's clip of the mean runs after the last round is written.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from simulator import run_ranks
from toy_front_end import ToyFrontEnd

import hvdcompress as hc
from hvdcompress.step.frontend import FrontEnd
from hvdcompress.torch import fsdp
from hvdcompress.torch.ddp import CompressionState
from hvdcompress.torch.hsdp import HSDPState
from hvdcompress.torch.optimizer_steps import OptimizerSteps

HERE = Path(__file__).parent
SEQUENCE = ("ready", "drain", "wait", "updated", "_send", "_compress", "_group_entries")


def test_the_toy_front_end_is_small():
    assert len((HERE / "toy_front_end.py").read_text().splitlines()) < 150


@pytest.mark.parametrize("front_end", [ToyFrontEnd, CompressionState, HSDPState, fsdp.CompressionState,
                                       OptimizerSteps])
def test_front_ends_fill_the_contract_and_keep_its_sequence(front_end):
    assert issubclass(front_end, FrontEnd)
    for step in SEQUENCE:
        assert getattr(front_end, step) is getattr(FrontEnd, step), f"{front_end.__name__} overrides {step}"


def test_the_tensorflow_exchange_fills_the_contract_and_keeps_its_sequence():
    from hvdcompress.tensorflow.steps import TapeSteps
    test_front_ends_fill_the_contract_and_keep_its_sequence(TapeSteps)


def test_a_front_end_that_leaves_a_member_out_cannot_be_built():
    class Partial(FrontEnd):
        def name(self, key):
            return key

    with pytest.raises(TypeError, match="abstract"):
        Partial(None)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.b = torch.nn.Parameter(torch.zeros(3))
        self.a = torch.nn.Parameter(torch.zeros(4))


def grads(rank: int, step: int) -> dict:
    gen = np.random.default_rng(10 * step + rank)
    return {"a": gen.standard_normal(4).astype(np.float32), "b": gen.standard_normal(3).astype(np.float32)}


def toy_run(compression, steps: int = 3, clip=None, log=None) -> list:
    def body(comm):
        model = Linear()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        front = Recording(model, opt, compression(), comm, clip_grad_norm=clip)
        front.log, front.comm_log = (log if comm.rank == 0 and log is not None else []), comm.log
        for step in range(steps):
            front.step({n: torch.from_numpy(g) for n, g in grads(comm.rank, step).items()})
        return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return run_ranks(2, body, threads=1)


class Recording(ToyFrontEnd):
    """The toy, logging the framework calls the sequence makes and the collectives before them."""

    def clip_local(self, params, scale):
        self.log.append(("clip_local", [self.name(p) for p in params], len(self.comm_log)))
        super().clip_local(params, scale)

    def clip_mean(self, params):
        self.log.append(("clip_mean", [self.name(p) for p in params], len(self.comm_log)))
        return super().clip_mean(params)

    def write(self, entry):
        self.log.append(("write", entry.info.name, len(self.comm_log)))
        super().write(entry)


def test_dense_toy_equals_numpy_averaged_sgd():
    got = toy_run(hc.NoCompression)
    want = {"a": np.zeros(4, np.float32), "b": np.zeros(3, np.float32)}
    for step in range(3):
        for n in want:
            mean = (grads(0, step)[n] + grads(1, step)[n]) / np.float32(2)
            want[n] = want[n] - np.float32(0.5) * mean
    for rank in got:
        for n in want:
            np.testing.assert_allclose(rank[n], want[n], rtol=1e-6, atol=1e-7)


def test_topk_with_error_feedback_toy_equals_numpy():
    got = toy_run(lambda: hc.ErrorFeedback(hc.TopK(2)))
    want = {"a": np.zeros(4, np.float32), "b": np.zeros(3, np.float32)}
    residual = [{n: np.zeros_like(v) for n, v in want.items()} for _ in range(2)]
    for step in range(3):
        for n in want:
            total = np.zeros_like(want[n])
            for r in range(2):
                x = grads(r, step)[n] + residual[r][n]
                keep = np.argsort(-np.abs(x), kind="stable")[:2]
                sent = np.zeros_like(x)
                sent[keep] = x[keep]
                residual[r][n] = x - sent
                total += sent
            want[n] = want[n] - np.float32(0.5) * (total / np.float32(2))
    assert np.array_equal(got[0]["a"], got[1]["a"]) and np.array_equal(got[0]["b"], got[1]["b"])
    for n in want:
        np.testing.assert_allclose(got[0][n], want[n], rtol=1e-6, atol=1e-7)


def test_with_state_the_clip_comes_first_in_name_order_before_any_collective():
    log: list = []
    toy_run(lambda: hc.ErrorFeedback(hc.TopK(2)), steps=1, clip=0.5, log=log)
    first = log[0]
    assert first[:2] == ("clip_local", ["a", "b"]), log
    agreement = first[2]
    assert all(kind == "write" and calls > agreement for kind, _, calls in log[1:]), log
    assert not any(kind == "clip_mean" for kind, _, _ in log), log


def test_without_state_the_mean_is_clipped_after_every_round():
    log: list = []
    toy_run(hc.FP16, steps=1, clip=0.5, log=log)
    assert [kind for kind, _, _ in log] == ["write", "write", "clip_mean"], log
    assert log[-1][1] == ["a", "b"], log
