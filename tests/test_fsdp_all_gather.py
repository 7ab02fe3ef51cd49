"""hvdcompress.torch.fsdp's quantised parameter all-gather (``compress(..., all_gather=Int8())``,
:mod:`hvdcompress.torch.fsdp_gather`), in real torchrun processes over Gloo
(tests/fsdp/all_gather_worker.py, one launch), against a numpy reference written here.

The weights each Linear sees in its forward are, bit for bit, every rank's local shard (weight
rows and bias, flattened as FSDP2 flattens its all-gather input) quantised by numpy's int8
min-max per chunk and decoded (the kernels' float32 arithmetic: test_kernels.np_minmax and
``min + code · ((max − min)/255)``). The master shards stay exact: each SGD step moves the
full-precision shard by its gradient (torch's own ``add`` as the reference), never onto the
quantisation grid. Training with int8 reduce-scatter and int8 all-gather lowers the loss as dense
FSDP does; the all-gather's bytes follow the formula; what cannot run is refused.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ddp import HERE, torchrun
from test_fsdp import by_case
from test_kernels import np_minmax

import hvdcompress as hc
from hvdcompress.engines.accounting import ByteCount
from hvdcompress.torch import fsdp, fsdp_gather

WORKER = HERE / "fsdp" / "all_gather_worker.py"
CHUNK, LR, RANKS, STEPS = 64, 0.05, 2, 40
F32 = np.float32


@pytest.fixture(scope="module")
def run():
    return by_case(torchrun(RANKS, WORKER, [], timeout=600))


def quantised(x: np.ndarray) -> np.ndarray:
    """numpy's int8 min-max per CHUNK of ``x``, decoded in float32."""
    codes, bounds = np_minmax(x, CHUNK)
    lo, hi = np.repeat(bounds[0::2], CHUNK)[:x.size], np.repeat(bounds[1::2], CHUNK)[:x.size]
    return lo + codes.astype(F32) * ((hi - lo) / F32(255))


def forward_reference(step: list, layer: int) -> tuple:
    """(weight, bias) of ``layer`` as every rank decodes them: each rank's flat shard quantised."""
    pieces = []
    for rank in range(RANKS):
        w, b = (np.array(v, F32) for v in step[rank]["shards"][layer])
        flat = quantised(np.concatenate([w, b]))
        pieces.append((flat[:w.size], flat[w.size:]))
    weight = np.concatenate([w for w, _ in pieces]).reshape(-1)
    return weight, np.concatenate([b for _, b in pieces])


def test_forward_weights_are_each_ranks_shard_quantised(run):
    records = run["gather"]
    shapes = records[0]["shapes"]
    for s in range(2):
        step = [records[r]["steps"][s] for r in range(RANKS)]
        for rank in range(RANKS):
            seen = step[rank]["forward"]
            assert [layer for layer, _, _ in seen] == list(range(len(shapes)))
            for layer, weight, bias in seen:
                want_w, want_b = forward_reference(step, layer)
                np.testing.assert_array_equal(np.array(weight, F32), want_w, err_msg=f"step {s} layer {layer}")
                np.testing.assert_array_equal(np.array(bias, F32), want_b, err_msg=f"step {s} layer {layer}")
                exact = np.concatenate([np.array(step[r]["shards"][layer][0], F32) for r in range(RANKS)])
                assert not np.array_equal(want_w, exact)   # the quantisation is visible
                span = exact.max() - exact.min()
                assert np.abs(want_w - exact).max() <= span / 510 * 1.0001


def test_master_shards_stay_exact(run):
    """SGD's step on the full-precision shard: after = before - lr·grad, by torch's own add."""
    for rank in range(RANKS):
        for step in run["gather"][rank]["steps"]:
            for before, grad, after in zip(step["shards"], step["grads"], step["after"]):
                for b, g, a in zip(before, grad, after):
                    want = torch.tensor(b).add(torch.tensor(g), alpha=-LR)
                    np.testing.assert_array_equal(np.array(a, F32), want.numpy())
                    assert not np.array_equal(np.array(a, F32), quantised(np.array(a, F32)))


def test_training_with_int8_reduce_scatter_and_all_gather(run):
    dense = np.mean([np.mean(run["train:dense"][r]["losses"][-5:]) for r in range(RANKS)])
    for r in range(RANKS):
        losses = run["train:int8"][r]["losses"]
        assert np.mean(losses[-5:]) < 0.95 * np.mean(losses[:5]), losses
    loss = np.mean([np.mean(run["train:int8"][r]["losses"][-5:]) for r in range(RANKS)])
    assert loss <= 1.05 * dense, f"int8 + int8 all-gather {loss:.4f} against dense {dense:.4f}"


def test_all_gather_bytes_follow_the_formula(run):
    """Per gather, this rank's shard of n float32 elements: 4n dense, n codes + 8·ceil(n/CHUNK)
    bytes of bounds sent; two gathers per unit and step (forward, and backward after FSDP2's
    reshard_after_forward); ``total_bytes`` = gradients + parameters."""
    shards = [out // RANKS * (inp + 1) for inp, out in ((32, 64), (64, 48), (48, 10))]   # weight rows + bias
    gathers = 2 * STEPS
    want = ByteCount(dense=gathers * sum(4 * n for n in shards),
                     sent=gathers * sum(n + 8 * -(-n // CHUNK) for n in shards))
    for r in range(RANKS):
        counted = run["train:int8"][r]["bytes"]
        assert (counted["all_gather"]["dense"], counted["all_gather"]["sent"]) == (want.dense, want.sent)
        grads = counted["gradients"]
        assert counted["total"]["dense"] == grads["dense"] + want.dense
        assert counted["total"]["sent"] == grads["sent"] + want.sent
        assert counted["total"]["steps"] == grads["steps"] == STEPS
        assert 3.5 < want.dense / want.sent < 4


def test_fsdp1_and_hsdp_are_refused(run):
    messages = run["refusals"][0]["messages"]
    assert "all_gather= needs FSDP2" in messages["fsdp1"] and "FSDP1" in messages["fsdp1"]
    assert "'all_gather'" in messages["hsdp"]


@pytest.mark.parametrize("all_gather", [hc.TopK(0.1), hc.FP16(), hc.ErrorFeedback(hc.Int8()),
                                        {"compressor": "onebit"}, hc.QSGD(16)])
def test_what_cannot_run_is_refused(all_gather):
    with pytest.raises(ValueError, match="all_gather=.*deterministic min-max quantisers only"):
        fsdp.compress(torch.nn.Linear(2, 2), compression=hc.Int8(), all_gather=all_gather)


@pytest.mark.parametrize("all_gather", [hc.Int8(), hc.Int8(chunk=256), {"compressor": "int8"}])
def test_the_quantisers_are_taken(all_gather):
    gather_codec = fsdp_gather.codec(torch.nn.Linear(2, 2), all_gather)
    assert type(gather_codec.compressor) is hc.Int8
    assert fsdp_gather.codec(torch.nn.Linear(2, 2), None) is None
