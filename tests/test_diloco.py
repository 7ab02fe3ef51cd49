"""hvdcompress.torch.DiLoCo: the outer sync against a numpy reference of DiLoCo, in real processes.

One launch per backend runs every case of tests/hvd/torch_diloco.py on 2 ranks: Horovod
(``horovodrun -np 2 --gloo``) and torch.distributed (``torchrun``, gloo). Against its records:

* after every sync each rank's parameters are the same bits, and those of the reference written
  here: the mean pseudo-gradient g = (Δ_0 + Δ_1)·0.5 and the outer step m ← μ·m + g,
  x ← x − η·(g + μ·m) (Nesterov) or x − η·m, in float32. Bit for bit: at 2 ranks the sum is one
  float addition (which commutes), the halving is exact, and the outer step is the same float32
  multiplications and additions in the same order (no fused multiply-add: each torch operation
  rounds once, as numpy's). The linear model (grad w = c, integer c, inner SGD at lr 0.5, every
  inner value exact) checks the whole run from scratch; the AdamW runs check each sync from the
  parameters each rank had just before it (AdamW's own arithmetic is torch's);
* top-k 5% with error feedback: the reference selects, keeps the residual and averages as the
  engine does (the payloads are allgathered and scatter-added), bit for bit; and error feedback
  conserves mass: Σ over syncs and ranks of Δ = Σ over syncs of 2·g + Σ over ranks of e;
* checkpoints taken mid-interval (one rank's, and gathered) resume on the same bits;
* bytes: dense is what every-step data parallelism sends over the same steps;
* ``check_replicas=1``: a rank whose anchor drifts is named on every rank after the next sync;
* ranks that disagree on sync_every, the compressor or the starting parameters fail on every
  rank at construction; bad arguments raise ValueErrors naming them (in this process);
* examples/diloco_train.py trains, in the Horovod launch.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_horovod

import hvdcompress as hc
from hvdcompress.compressors.density import resolve_k
from hvdcompress.step.diloco import OuterSettings, outer_step
from hvdcompress.torch import TorchOps
from hvdcompress.torch import diloco as diloco_module
from hvdcompress.torch.diloco import DiLoCo

HERE = Path(__file__).parent
F = np.float32
N = 12


def launch(backend: str) -> dict:
    """Every case's records, per rank: case -> [rank 0's, rank 1's]."""
    if backend == "horovod":
        records = run_horovod("torch_diloco.py", np=2, args=["horovod"], timeout=300)
        per_rank = [[r for r in records if r["rank"] == i] for i in range(2)]
    else:
        from test_ddp import torchrun
        per_rank = torchrun(2, HERE / "hvd" / "torch_diloco.py", ["dist"], timeout=300)
    return {r.get("case", "example"): [r, other] for r, other in zip(*per_rank)}


@pytest.fixture(scope="module", params=["horovod", "dist"])
def cases(request) -> dict:
    return launch(request.param)


def arrays(values) -> np.ndarray:
    return np.array(values, dtype=F)


def outer(anchor, m, g, lr, mu, nesterov) -> tuple:
    """The reference outer step: (new anchor, new momentum), float32."""
    m = m * F(mu) + g
    direction = g + m * F(mu) if nesterov else m
    return anchor - direction * F(lr), m


def linear_reference(lr, mu, nesterov, steps=8, every=3) -> list:
    """Each rank's parameters after every step of tests/hvd/torch_diloco.py's linear case."""
    anchor, m = np.zeros(N, F), np.zeros(N, F)
    w = [anchor.copy(), anchor.copy()]
    out = [[], []]
    for t in range(steps):
        for r in range(2):
            c = np.random.default_rng(1000 * r + t).integers(-4, 5, N).astype(F)
            w[r] = w[r] - F(0.5) * c
        if (t + 1) % every == 0:
            g = ((anchor - w[0]) + (anchor - w[1])) * F(0.5)
            anchor, m = outer(anchor, m, g, lr, mu, nesterov)
            w = [anchor.copy(), anchor.copy()]
        for r in range(2):
            out[r].append(w[r].copy())
    return out


@pytest.mark.parametrize("case, lr, mu, nesterov", [("linear_nesterov", 0.7, 0.9, True),
                                                    ("linear_plain", 1.0, 0.5, False)])
def test_linear_run_equals_the_reference_bit_for_bit(cases, case, lr, mu, nesterov):
    expected = linear_reference(lr, mu, nesterov)
    for r, record in enumerate(cases[case]):
        got = [arrays(a) for a in record["after"]]
        for t, (a, b) in enumerate(zip(got, expected[r])):
            assert a.tobytes() == b.tobytes(), f"rank {r}, step {t + 1}: {a} != {b}"
    assert cases[case][0]["bytes"] == cases[case][1]["bytes"]
    assert cases[case][0]["bytes"]["dense"] == 8 * 4 * N and cases[case][0]["bytes"]["sent"] == 2 * 4 * N


def topk_mean(deltas: list, residuals: list, sizes: dict, k: float) -> tuple:
    """Top-k with error feedback per tensor, averaged over the ranks: (g, new residuals)."""
    g, new = [], [[], []]
    start = 0
    for n in sizes.values():
        total = np.zeros(n, F)
        for r in range(2):
            p = deltas[r][start:start + n] + residuals[r][start:start + n]
            keep = np.argsort(-np.abs(p), kind="stable")[:resolve_k(k, n)]
            sent = np.zeros(n, F)
            sent[keep] = p[keep]
            total = total + sent
            new[r].append(p - sent)
        g.append(total * F(0.5))
        start += n
    return np.concatenate(g), [np.concatenate(e) for e in new]


@pytest.mark.parametrize("case", ["adamw_dense", "adamw_topk"])
def test_every_sync_equals_the_reference_on_every_rank(cases, case):
    ranks = cases[case]
    sizes = ranks[0]["sizes"]
    numel = sum(sizes.values())
    anchor, m = arrays(ranks[0]["before"][0]["anchor"]), np.zeros(numel, F)
    residuals = [np.zeros(numel, F), np.zeros(numel, F)]
    assert len(ranks[0]["before"]) == 3
    for s in range(3):
        params = [arrays(rec["before"][s]["params"]) for rec in ranks]
        for rec in ranks:
            assert arrays(rec["before"][s]["anchor"]).tobytes() == anchor.tobytes(), f"sync {s}: anchor"
        assert not np.array_equal(params[0], params[1]), "the sites did not train apart"
        deltas = [anchor - p for p in params]
        if case == "adamw_dense":
            g = (deltas[0] + deltas[1]) * F(0.5)
        else:
            g, residuals = topk_mean(deltas, residuals, sizes, 0.05)
        for rec in ranks:
            assert arrays(rec["grads"][s]).tobytes() == g.tobytes(), f"sync {s}: mean outer gradient"
        anchor, m = outer(anchor, m, g, 0.7, 0.9, True)
        for r, rec in enumerate(ranks):
            got = arrays(rec["after"][s])
            assert got.tobytes() == anchor.tobytes(), \
                f"rank {r}, sync {s}: max difference {np.abs(got - anchor).max()}"
    if case == "adamw_topk":
        for r, rec in enumerate(ranks):
            got = np.concatenate([arrays(rec["residuals"][n]) for n in sizes])
            assert got.tobytes() == residuals[r].tobytes(), f"rank {r}: residuals"


def test_error_feedback_conserves_mass_across_syncs(cases):
    """Σ_s Σ_r Δ_{r,s} = Σ_s 2·g_s + Σ_r e_r: what the syncs did not send is still held."""
    ranks = cases["adamw_topk"]
    sizes = ranks[0]["sizes"]
    deltas = sum(arrays(rec["before"][s]["anchor"]).astype(np.float64) - arrays(rec["before"][s]["params"])
                 for rec in ranks for s in range(3))
    sent = sum(2.0 * arrays(g).astype(np.float64) for g in ranks[0]["grads"])
    held = sum(np.concatenate([arrays(rec["residuals"][n]) for n in sizes]).astype(np.float64) for rec in ranks)
    assert np.abs(held).max() > 0 and np.count_nonzero(ranks[0]["grads"][0]) < 0.15 * sum(sizes.values())
    np.testing.assert_allclose(sent + held, deltas, rtol=0, atol=1e-6)


def test_bytes_count_what_data_parallelism_would_send(cases):
    dense = cases["adamw_dense"][0]
    assert dense["bytes"] == {"dense": 6 * 508 * 4, "sent": 3 * 508 * 4, "steps": 6, "ratio": 2.0}
    topk = cases["adamw_topk"][0]
    per_sync = sum(8 * resolve_k(0.05, n) for n in topk["sizes"].values())
    assert topk["last_sync"]["dense"] == 508 * 4 and topk["last_sync"]["sent"] == per_sync
    assert topk["bytes"]["dense"] == 6 * 508 * 4 and topk["bytes"]["sent"] == 3 * per_sync


def test_checkpoints_resume_on_the_same_bits(cases):
    for r, rec in enumerate(cases["resume"]):
        assert rec["steps"] == 8
        for at, got in rec["resumed"].items():
            assert arrays(got).tobytes() == arrays(rec["straight"]).tobytes(), f"rank {r}, resumed {at}"
    assert cases["resume"][0]["straight"] == cases["resume"][1]["straight"]


@pytest.mark.parametrize("case, word", [("disagree_sync_every", "sync_every"),
                                        ("disagree_compression", "compression"),
                                        ("disagree_parameters", "parameters")])
def test_ranks_that_disagree_fail_on_every_rank(cases, case, word):
    for rec in cases[case]:
        assert rec["error"] is not None and f"ranks disagree on {word}" in rec["error"], rec["error"]


def test_a_replica_that_drifts_is_named_on_every_rank_after_the_sync(cases):
    errors = [r["error"] for r in cases["replicas_differ"]]
    assert all(e is not None for e in errors), errors
    assert all("0.bias" in e for e in errors), errors   # the tensor nudged (the first by name)
    assert [r["syncs"] for r in cases["replicas_differ"]] == [2, 2]   # raised at the second sync


def test_the_example_trains_and_its_ranks_agree(cases):
    """examples/diloco_train.py (Horovod launch): 40 steps, a sync every 10, a checkpoint reloaded."""
    if "example" not in cases:
        pytest.skip("the example runs under horovodrun only")
    ranks = cases["example"]
    assert ranks[0]["param_checksum"] == ranks[1]["param_checksum"]
    assert [s for s, _ in ranks[0]["curve"]] == [0, 10, 20, 30, 40]
    assert ranks[0]["final_bpb"] < ranks[0]["curve"][0][1] - 1.0, ranks[0]["curve"]
    assert ranks[0]["dense_bytes"] > 30 * ranks[0]["sent_bytes"] > 0   # H = 10, int8: 40x


def test_outer_step_on_ops_equals_numpy():
    rng = np.random.default_rng(3)
    anchor, m, g = (rng.standard_normal(257).astype(F) for _ in range(3))
    for nesterov in (True, False):
        state = {"anchor": torch.from_numpy(anchor.copy()), "momentum": torch.from_numpy(m.copy())}
        got = outer_step(TorchOps(), state, torch.from_numpy(g), OuterSettings(5, 0.7, 0.9, nesterov))
        want_anchor, want_m = outer(anchor, m, g, 0.7, 0.9, nesterov)
        assert got.numpy().tobytes() == want_anchor.tobytes()
        assert state["momentum"].numpy().tobytes() == want_m.tobytes()


def inner():
    return torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)


@pytest.mark.parametrize("kwargs, words", [
    ({"sync_every": 0}, "sync_every=0"), ({"sync_every": 2.5}, "sync_every=2.5"),
    ({"sync_every": True}, "sync_every=True"), ({"sync_every": "50"}, "sync_every='50'"),
    ({"outer_lr": 0}, "outer_lr=0"), ({"outer_lr": -0.7}, "outer_lr=-0.7"),
    ({"outer_lr": math.inf}, "outer_lr=inf"), ({"outer_lr": math.nan}, "outer_lr=nan"),
    ({"outer_momentum": 1.0}, "outer_momentum=1.0"), ({"outer_momentum": -0.1}, "outer_momentum=-0.1"),
    ({"nesterov": "yes"}, "nesterov='yes'"),
    ({"compression": hc.DGC(0.99)}, "takes the optimizer's momentum"),
    ({"compression": {"compressor": "topk", "momentum": "nesterov"}}, "takes the optimizer's momentum"),
    ({"compression": {"compressor": "onebit", "ef": "vanilla", "adam": "frozen"}}, "Adam over"),
    ({"compression": "auto"}, "'auto' plans"),
    ({"process_group": object(), "process_set": object()}, "allowed: one of them"),
    ({}, "no process group to sync over"),
])
def test_bad_arguments_raise_naming_them(kwargs, words, monkeypatch):
    # another test module of this process may have run hvd.init(): these cases are of a process
    # with neither Horovod nor torch.distributed running
    monkeypatch.setattr(diloco_module, "_horovod_running", lambda: False)
    with pytest.raises(ValueError, match="allowed") as error:
        DiLoCo(inner(), **kwargs)
    assert words in str(error.value)


def test_the_inner_optimizer_must_be_one():
    with pytest.raises(ValueError, match="inner_optimizer=.*allowed: a torch.optim.Optimizer"):
        DiLoCo([torch.zeros(1)])


def test_zero_grad_takes_an_inner_optimizer_without_arguments():
    """A data-parallel inner optimizer (Horovod's DistributedOptimizer: ``zero_grad(self)``)."""
    class HorovodLike:
        def __init__(self):
            self.calls = []

        def zero_grad(self):
            self.calls.append("none")

    class Torchlike(HorovodLike):
        def zero_grad(self, set_to_none=True):
            self.calls.append(set_to_none)

    opt = DiLoCo.__new__(DiLoCo)
    opt.inner = HorovodLike()
    opt.zero_grad()
    assert opt.inner.calls == ["none"]
    opt.inner = Torchlike()
    opt.zero_grad(set_to_none=False)
    opt.zero_grad()
    assert opt.inner.calls == [False, True]
