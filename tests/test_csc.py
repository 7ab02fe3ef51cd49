"""CSC (coarse-grained sparsification) against a numpy reference of the whole algorithm.

Ranks are simulated in one process: each rank's gradient is compressed, the round-0 payloads
(chunk norms) are summed by hand as allreduce would, every rank resumes with that sum, the
round-1 payloads (chosen chunks' values) are summed by hand, and each rank decompresses.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import hvdcompress as hc
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.ops.torch_ops import TorchOps

OPS = TorchOps()


def grad(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def rank_sum(arrays: list) -> np.ndarray:
    """What an allreduce (sum) gives, added in rank order."""
    total = arrays[0].copy()
    for a in arrays[1:]:
        total = total + a
    return total


# ---- the numpy reference ------------------------------------------------------------------------
def np_chunk_norms(v: np.ndarray, chunk: int) -> np.ndarray:
    nchunks = -(-v.size // chunk)
    padded = np.zeros(nchunks * chunk, np.float32)
    padded[:v.size] = np.abs(v)
    return padded.reshape(nchunks, chunk).sum(axis=1, dtype=np.float32)


def np_csc_step(gs, us, vs, ratio, chunk, mu, nesterov, masking, wd=0.0, w=None):
    """One CSC step over all ranks: (each rank's chunk norms, the dense sum over ranks, new us,
    new vs, chosen chunks)."""
    us, vs = [u.copy() for u in us], [v.copy() for v in vs]
    for r, g in enumerate(gs):
        if wd:
            g = g + w * np.float32(wd)
        if nesterov:
            us[r] = (us[r] + g) * np.float32(mu)
            vs[r] = vs[r] + us[r] + g
        else:
            us[r] = us[r] * np.float32(mu) + g
            vs[r] = vs[r] + us[r]
    own = [np_chunk_norms(v, chunk) for v in vs]
    norms = rank_sum(own)
    nchunks = norms.size
    k = min(nchunks, max(1, math.ceil(round(ratio * nchunks, 6))))
    chosen = np.sort(np.lexsort((np.arange(nchunks), -norms))[:k])  # largest, lower index first
    idx = np.concatenate([np.arange(c * chunk, min((c + 1) * chunk, vs[0].size)) for c in chosen])
    total = rank_sum([v[idx] for v in vs])
    dense = np.zeros(vs[0].size, np.float32)
    dense[idx] = total
    for r in range(len(vs)):
        vs[r][idx] = 0
        if masking:
            us[r][idx] = 0
    return own, dense, us, vs, chosen


# ---- the simulated ranks --------------------------------------------------------------------------
def exchange(comp, grads: list, states: list, info_of=lambda r: TensorInfo("w", 0)) -> dict:
    """One step of ``comp`` on every rank's gradient, the collectives summed by hand."""
    world = len(grads)
    infos = [info_of(r) for r in range(world)]
    packets = []
    for g, state, info in zip(grads, states, infos):
        t = torch.from_numpy(g.copy())
        comp.init_state(OPS, t, state, info)
        packets.append(comp.compress(OPS, t, state, info))
    rounds = []
    while packets[0].resume is not None:
        assert all(p.summable and p.resume is not None for p in packets)
        wire = rank_sum([p.tensors[0].numpy() for p in packets])
        rounds.append([p.tensors[0].numpy().copy() for p in packets])
        packets = [p.resume([torch.from_numpy(wire.copy())]) for p in packets]
    assert all(p.summable and p.resume is None and len(p.tensors) == 1 for p in packets)
    rounds.append([p.tensors[0].numpy().copy() for p in packets])
    wire = rank_sum(rounds[-1])
    dense = [comp.decompress(OPS, [torch.from_numpy(wire.copy())], p.ctx, info).numpy()
             for p, info in zip(packets, infos)]
    comp.on_step()
    return {"rounds": rounds, "dense": dense}


@pytest.mark.parametrize("world,nesterov,masking,wd", [(2, False, True, 0.0), (3, True, True, 0.0),
                                                       (3, False, False, 1e-2), (2, True, False, 0.0)])
def test_three_steps_match_numpy_bit_exact(world, nesterov, masking, wd):
    n, chunk, ratio, mu = 1000, 64, 0.2, 0.9  # 16 chunks, the last of 40 elements; 4 sent
    comp = hc.CSC(ratio, chunk, momentum=mu, nesterov=nesterov, masking=masking, weight_decay=wd,
                  min_numel=0)
    w = grad(n, seed=99)
    info_of = lambda r: TensorInfo("w", n, world=world, rank=r, param=torch.from_numpy(w))
    states = [{} for _ in range(world)]
    us = [np.zeros(n, np.float32) for _ in range(world)]
    vs = [np.zeros(n, np.float32) for _ in range(world)]
    for step in range(3):
        gs = [grad(n, seed=10 * step + r) for r in range(world)]
        got = exchange(comp, gs, states, info_of)
        ref_norms, ref_dense, us, vs, chosen = np_csc_step(gs, us, vs, ratio, chunk, mu, nesterov,
                                                           masking, wd, w)
        norms, values = got["rounds"]
        for r in range(world):  # round 0: float32 sums, added in another order than numpy's
            np.testing.assert_allclose(norms[r], ref_norms[r], rtol=1e-5)
        assert [a.size for a in values] == [len(chosen) * chunk] * world  # fixed size: K chunks
        for r in range(world):
            np.testing.assert_array_equal(got["dense"][r], ref_dense)
            np.testing.assert_array_equal(states[r]["momentum"].numpy(), us[r])
            np.testing.assert_array_equal(states[r]["velocity"].numpy(), vs[r])


@pytest.mark.parametrize("ratio", [1.0, 0.999])  # dense path; chunk path with all 16 chunks chosen
def test_all_chunks_without_momentum_is_the_dense_average(ratio):
    n, world = 1000, 3
    comp = hc.CSC(ratio, 64, momentum=0.0, min_numel=0)
    states = [{} for _ in range(world)]
    for step in range(3):
        gs = [grad(n, seed=10 * step + r) for r in range(world)]
        got = exchange(comp, gs, states, lambda r: TensorInfo("w", n, world=world, rank=r))
        assert len(got["rounds"]) == (1 if ratio == 1.0 else 2)
        for r in range(world):
            np.testing.assert_array_equal(got["dense"][r] / np.float32(world),
                                          rank_sum(gs) / np.float32(world))
            np.testing.assert_array_equal(states[r]["velocity"].numpy(), np.zeros(n, np.float32))


def test_tied_norms_pick_the_lower_chunks_on_every_rank():
    chunk, nchunks = 8, 8
    # rank 0 alone would pick the last chunks, rank 1 the first; their sums all tie
    g0 = np.repeat(np.arange(1, nchunks + 1, dtype=np.float32), chunk)
    g1 = np.repeat(np.arange(nchunks, 0, -1, dtype=np.float32), chunk)
    comp = hc.CSC(0.25, chunk, momentum=0.0, min_numel=0)
    states = [{}, {}]
    got = exchange(comp, [g0, g1], states, lambda r: TensorInfo("w", chunk * nchunks, world=2, rank=r))
    norms = rank_sum(got["rounds"][0])
    assert np.all(norms == norms[0])
    expected = np.zeros(chunk * nchunks, np.float32)
    expected[:2 * chunk] = nchunks + 1  # chunks 0 and 1: g0 + g1
    for r, g in enumerate((g0, g1)):
        np.testing.assert_array_equal(got["dense"][r], expected)
        kept = g.copy()
        kept[:2 * chunk] = 0
        np.testing.assert_array_equal(states[r]["velocity"].numpy(), kept)


def test_a_non_finite_chunk_is_sent_first_and_leaves_the_residual():
    n, chunk = 100, 10
    g0, g1 = grad(n, seed=1), grad(n, seed=2)
    g0[53] = np.nan
    comp = hc.CSC(0.1, chunk, momentum=0.0, min_numel=0)  # one chunk of ten
    states = [{}, {}]
    got = exchange(comp, [g0, g1], states, lambda r: TensorInfo("w", n, world=2, rank=r))
    assert np.isinf(rank_sum(got["rounds"][0])[5])
    expected = np.zeros(n, np.float32)
    expected[50:60] = g0[50:60] + g1[50:60]
    for r in range(2):
        np.testing.assert_array_equal(got["dense"][r], expected)  # NaN at 53 included
        assert np.isfinite(states[r]["velocity"].numpy()).all()


def test_payload_bytes_do_not_depend_on_the_number_of_ranks():
    n, chunk = 5000, 100
    sizes = []
    for world in (2, 16):
        comp = hc.CSC(0.1, chunk, min_numel=0, momentum=0.9)
        got = exchange(comp, [grad(n, seed=r) for r in range(world)], [{} for _ in range(world)],
                       lambda r: TensorInfo("w", n, world=world, rank=r))
        sizes.append([{a.nbytes for a in payloads} for payloads in got["rounds"]])
    assert sizes[0] == sizes[1] == [{50 * 4}, {5 * chunk * 4}]  # 50 norms, then 5 chunks


def test_small_tensors_are_sent_dense_with_momentum():
    n, mu = 100, 0.5
    comp = hc.CSC(momentum=mu)  # default min_numel: 16384
    states = [{}, {}]
    g = [grad(n, seed=1), grad(n, seed=2)]
    exchange(comp, g, states, lambda r: TensorInfo("b", n, world=2, rank=r))
    got = exchange(comp, g, states, lambda r: TensorInfo("b", n, world=2, rank=r))
    assert len(got["rounds"]) == 1
    for r in range(2):
        np.testing.assert_array_equal(got["rounds"][0][r], g[r] * np.float32(mu) + g[r])


@pytest.mark.parametrize("unit", ["step", "epoch"])
def test_warmup_ramps_the_chunk_ratio_exponentially(unit):
    n, chunk, ratio, length = 400, 4, 0.01, 3  # 100 chunks
    comp = hc.CSC(ratio, chunk, min_numel=0, momentum=0.0,
                  warmup=hc.ExponentialWarmup(length, unit=unit))
    states = [{}, {}]
    chunks_sent = []
    for t in range(5):
        if unit == "epoch":
            comp.set_epoch(t)
        got = exchange(comp, [grad(n, seed=t), grad(n, seed=t + 9)], states,
                       lambda r: TensorInfo("w", n, world=2, rank=r))
        chunks_sent.append(got["rounds"][1][0].size // chunk)
    # ratio ** ((t + 1) / length) of 100 chunks, rounded up: 21.5, 4.6, then 1
    assert chunks_sent == [22, 5, 1, 1, 1]


@pytest.mark.parametrize("kwargs,message", [
    ({"ratio": 0.0}, r"CSC: ratio=0.0 is out of range; allowed: a number in \(0.0, 1.0\]"),
    ({"ratio": 1.5}, r"CSC: ratio=1.5 is out of range; allowed: a number in \(0.0, 1.0\]"),
    ({"ratio": "0.1"}, r"CSC: ratio='0.1' is out of range"),
    ({"chunk": 0}, r"CSC: chunk=0 is out of range; allowed: an integer >= 1"),
    ({"chunk": 2.5}, r"CSC: chunk=2.5 is out of range; allowed: an integer >= 1"),
    ({"momentum": 1.0}, r"CSC: momentum=1.0 is out of range"),
    ({"warmup": 5}, r"CSC: warmup=5 is not a schedule"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hc.CSC(**kwargs)


def test_registered_and_built_from_strings():
    assert "csc" in hc.available()
    default = hc.from_params({"compressor": "csc"})
    assert isinstance(default, hc.CSC) and (default.ratio, default.chunk) == (0.01, 1024)
    built = hc.from_params({"compressor": "csc", "ratio": "0.05", "chunk": "256", "min_numel": "0",
                            "momentum": "nesterov", "momentum_mu": "0.9"})
    assert (built.ratio, built.chunk, built.min_numel, built.momentum, built.nesterov) == \
        (0.05, 256, 0, 0.9, True)
    assert built.takes_over_momentum
    ramped = hc.from_params({"compressor": "csc", "ratio": "0.01", "warmup_steps": "2"})
    assert [round(1 - ramped.warmup.sparsity(t, 0.99), 6) for t in range(4)] == [0.215443, 0.046416, 0.01, 0.01]
    with pytest.raises(ValueError, match=r"from_params: chunk='big' cannot be read as int"):
        hc.from_params({"compressor": "csc", "chunk": "big"})


# ---- real Horovod, 2 ranks ------------------------------------------------------------------------
TOY = {"n": 1000, "bias": 10, "chunk": 64, "ratio": 0.25, "min_numel": 100, "warmup": 2,
       "steps": 4, "lr": 0.25, "mu": 0.9}  # 16 chunks (the last of 40 elements): 8 sent, then 4


def np_toy_training(cfg: dict, world: int) -> tuple:
    """tests/hvd/{torch,tf}_csc.py in numpy: final (w, b) and bytes each rank sends per step.
    ``lr`` is a power of 2 and ``world`` 2, so every product and sum is exact in any order."""
    n, bias, chunk, mu, lr = cfg["n"], cfg["bias"], cfg["chunk"], cfg["mu"], np.float32(cfg["lr"])
    w, b = np.zeros(n, np.float32), np.zeros(bias, np.float32)
    us = vs = [np.zeros(n, np.float32)] * world
    ub = [np.zeros(bias, np.float32)] * world
    sent = []
    for step in range(cfg["steps"]):
        c = [np.random.default_rng(100 + 10 * step + r).standard_normal(n).astype(np.float32)
             for r in range(world)]
        d = [np.random.default_rng(500 + 10 * step + r).standard_normal(bias).astype(np.float32)
             for r in range(world)]
        ratio = cfg["ratio"] ** (min(step + 1, cfg["warmup"]) / cfg["warmup"])
        _, dense, us, vs, chosen = np_csc_step(c, us, vs, ratio, chunk, mu, cfg["nesterov"],
                                               masking=False)  # CSC's default
        if cfg["nesterov"]:  # the bias goes dense: u, plus g with Nesterov; the velocity is empty
            ub = [(u + g) * np.float32(mu) for u, g in zip(ub, d)]
            payload = [u + g for u, g in zip(ub, d)]
        else:
            ub = payload = [u * np.float32(mu) + g for u, g in zip(ub, d)]
        w = w - lr * (dense * np.float32(1 / world))
        b = b - lr * (rank_sum(payload) * np.float32(1 / world))
        sent.append(4 * (-(-n // chunk) + len(chosen) * chunk + bias))
    return w, b, sent


@pytest.fixture(scope="module")
def horovod_runs() -> dict:
    """(script, nesterov) -> the ranks' records: torch's two configs in one launch, TF's in one."""
    from conftest import run_horovod

    out: dict = {}
    torch_runs = run_horovod("torch_csc.py", np=2, args=[json.dumps([dict(TOY, nesterov=False),
                                                                     dict(TOY, nesterov=True)])])
    for r in torch_runs:
        out.setdefault(("torch_csc.py", r["run"] == 1), []).append(r)
    out[("tf_csc.py", True)] = run_horovod("tf_csc.py", np=2, args=[json.dumps(dict(TOY, nesterov=True))])
    return out


@pytest.mark.horovod
@pytest.mark.parametrize("script,nesterov", [("torch_csc.py", False), ("torch_csc.py", True),
                                             ("tf_csc.py", True)])
def test_horovod_ranks_end_identical_and_equal_to_numpy(horovod_runs, script, nesterov):
    cfg = dict(TOY, nesterov=nesterov)
    results = sorted(horovod_runs[(script, nesterov)], key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1]
    w, b, sent = np_toy_training(cfg, world=2)
    assert sent[0] > sent[1] == sent[-1]  # the warm-up sent 8 chunks, then 4
    for r in results:
        if script == "torch_csc.py":
            assert r["momentum_kept"] == cfg["mu"]  # the user's SGD setting survives the take-over
            assert r["sent"] == sent
        np.testing.assert_array_equal(np.array(r["w"], np.float32), w)
        np.testing.assert_array_equal(np.array(r["b"], np.float32), b)
