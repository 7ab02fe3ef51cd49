"""Fused compression (hvdcompress.engines.fusion) on the in-process simulator of P ranks: the buckets'
rule, each fused exchange against a numpy reference of the concatenated buffer, the collectives
it saves, and the argument checks. The wrappers' fused paths run under real Horovod in
tests/test_torch_optimizer.py (tests/hvd/torch_fusion.py) and tests/test_tf_horovod.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hvd.fusion_data import SIZES, grads
from simulator import run_nodes, run_ranks
from test_exchange import onebit

import hvdcompress as hc
from hvdcompress.auto import Auto
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.engines.exchange import Exchange
from hvdcompress.engines.fusion import (
    DEFAULT_BYTES,
    Bucket,
    FusedKey,
    buckets,
    check_fusion,
    compress_bucket,
    totals,
)
from hvdcompress.engines.two_level import two_level
from hvdcompress.ops.torch_ops import TorchOps
from hvdcompress.step.options import parse_options

OPS = TorchOps()


def tensors(itemsize: int = 4, key=None) -> list:
    return [(n, k, k * itemsize, key) for n, k in SIZES.items()]


# ---- the buckets' rule -------------------------------------------------------------------------
def test_buckets_hold_consecutive_names_up_to_the_threshold():
    everything = buckets(tensors(), 10 ** 6)
    assert everything == [Bucket(("a.bias", "a.weight", "b.bias", "b.weight"), (7, 300, 5, 1000))]
    assert everything[0].name == "fused[a.bias..b.weight]" and everything[0].numel == 1312
    # 4 * (7 + 300 + 5) = 1248 bytes fit in 1300; b.weight (4000 bytes) is alone: not fused
    assert buckets(tensors(), 1300) == [Bucket(("a.bias", "a.weight", "b.bias"), (7, 300, 5))]
    # nothing fits with another: no bucket at all
    assert buckets(tensors(), 20) == []


def test_buckets_never_span_keys_and_skip_empty_tensors():
    mixed = [("a", 10, 40, "float32"), ("b", 10, 20, "float16"), ("c", 10, 20, "float16"),
             ("d", 0, 0, "float16"), ("e", 10, 20, "float16"), ("f", 10, 40, "float32")]
    # d is empty: skipped, so e joins b and c; a and f share a dtype but are not consecutive
    assert buckets(mixed, 1000) == [Bucket(("b", "c", "e"), (10, 10, 10))]


def test_fusion_argument_checks():
    assert check_fusion(None, hc.Int8()) is None and check_fusion(False, hc.Int8()) is None
    assert check_fusion(True, hc.Int8()) == DEFAULT_BYTES
    assert check_fusion(4096, hc.ErrorFeedback(hc.OneBit())) == 4096
    for bad in (-1, 1.5, "64MB"):
        with pytest.raises(ValueError, match=f"fusion={bad!r}: allowed: None or False"):
            check_fusion(bad, hc.Int8())
    with pytest.raises(ValueError, match="fusion=4096 with PowerSGD.*each tensor's own shape"):
        check_fusion(4096, hc.PowerSGD(2))
    with pytest.raises(ValueError, match="fusion=True with groups=2: both decide"):
        parse_options(hc.Int8(), op="avg", average_op="avg", sum_op="sum", groups=2, fusion=True)
    with pytest.raises(ValueError, match="PowerSGD"):
        check_fusion(True, Auto(allowed=["none", {"compressor": "powersgd", "rank": 2}],
                                link="1gbit,20us", calibration=None))
    assert check_fusion(True, Auto(link="1gbit,20us", calibration=None)) == DEFAULT_BYTES


# ---- fused exchanges against numpy ---------------------------------------------------------------
def fused_step(world: int, compressor, steps: int = 1, **engine_args) -> list:
    """Each rank's per-tensor results of ``steps`` fused exchanges of :data:`SIZES` (one bucket),
    with the collectives' log."""
    bucket = buckets(tensors(), 10 ** 6)[0]

    def body(comm):
        engine = Exchange(compressor, OPS, comm, log_plan=False, **engine_args)
        state, out = {}, []
        for step in range(steps):
            items = [(n, torch.from_numpy(g), TensorInfo(name=n, numel=g.size, world=world, rank=comm.rank,
                                                         shape=g.shape))
                     for n, g in grads(comm.rank, step).items()]
            entry = compress_bucket(engine, bucket, items[::-1], state)   # any order in
            done = engine.finish(engine.start([entry]))
            out.append({n: t.numpy().copy() for n, t in totals(OPS, done[0])})
        return out, comm.log, state, engine.plan
    return run_ranks(world, body)


@pytest.mark.parametrize("world", [2, 3])
def test_fused_onebit_with_error_feedback_is_one_scale_and_one_residual_per_bucket(world):
    """ErrorFeedback(OneBit) over a bucket: each rank sends s * sign(p) of p = concat + residual,
    s = mean|p| over the whole bucket (one scale for layers 100x apart), and keeps p - that."""
    got = fused_step(world, hc.ErrorFeedback(hc.OneBit()), steps=2, collective="allgather")
    residual = [np.zeros(1312, np.float32) for _ in range(world)]
    for step in range(2):
        decoded = []
        for r in range(world):
            p = np.concatenate(list(grads(r, step).values())) + residual[r]
            decoded.append(onebit(p))
            residual[r] = p - decoded[-1]
        want = np.split(sum(decoded) / world, np.cumsum([7, 300, 5])[:])
        for r in range(world):
            for (name, result), expected in zip(got[r][0][step].items(), want):
                np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-7, err_msg=f"{name} step {step}")
    for r in range(world):
        np.testing.assert_allclose(got[r][2]["residual"].numpy(), residual[r], rtol=1e-5, atol=1e-6)
        # one allgather per round for the whole bucket: onebit's payload (bits and scale)
        assert [c for c, _, _ in got[r][1]] == ["allgather", "allgather"]
        assert list(got[r][3]) == ["fused[a.bias..b.weight]"]


def test_fused_topk_selects_over_the_bucket():
    """Top-k of a bucket picks the k largest of the concatenation: the biases (10x larger)
    first, whichever tensor they are in."""
    got = fused_step(2, hc.TopK(12))
    g = [np.concatenate(list(grads(r).values())) for r in range(2)]

    def topk(x):
        out = np.zeros_like(x)
        idx = np.argsort(-np.abs(x), kind="stable")[:12]
        out[idx] = x[idx]
        return out
    want = np.split((topk(g[0]) + topk(g[1])) / 2, np.cumsum([7, 300, 5]))
    for (name, result), expected in zip(got[0][0][0].items(), want):
        np.testing.assert_allclose(result, expected, rtol=1e-6, err_msg=name)
    assert np.count_nonzero(np.concatenate(want[0::2])) >= 12   # the biases hold the picks


def test_fused_fp16_equals_each_tensor_rounded_and_summed():
    got = fused_step(2, hc.FP16())
    want = {n: (grads(0)[n].astype(np.float16) + grads(1)[n].astype(np.float16)).astype(np.float32) / 2
            for n in SIZES}
    for name, result in got[1][0][0].items():
        np.testing.assert_allclose(result, want[name], rtol=1e-3, err_msg=name)
    assert got[1][1] == [("allreduce", "hvdc.fused[a.bias..b.weight].r0.allreduce", [1312])]


def test_a_bucket_of_other_tensors_or_mixed_settings_is_refused():
    bucket = Bucket(("a", "b"), (2, 2))

    def body(comm):
        engine = Exchange(hc.Int8(), OPS, comm, log_plan=False)
        x = torch.zeros(2)
        with pytest.raises(ValueError, match=r"got tensors \['a'\], expected \['a', 'b'\]"):
            compress_bucket(engine, bucket, [("a", x, TensorInfo("a", 2))], {})
        with pytest.raises(ValueError, match=r"differ in \['weight_decay'\]"):
            compress_bucket(engine, bucket, [("a", x, TensorInfo("a", 2)),
                                             ("b", x, TensorInfo("b", 2, weight_decay=0.1))], {})
        return True
    assert run_ranks(1, body) == [True]


def test_totals_of_an_unfused_entry_are_its_own():
    class Done:
        key, total = "w", torch.ones(3)
    assert list(totals(OPS, Done())) == [("w", Done.total)]
    Done.key = FusedKey(("u", "v"), (1, 2))
    assert [(k, t.tolist()) for k, t in totals(OPS, Done())] == [("u", [1.0]), ("v", [1.0, 1.0])]


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_a_fused_bucket_is_exchanged_as_one_tensor_of_its_concatenation(collective):
    """At 3 ranks, through the compressed allreduce (segments of the bucket, a server-side
    residual) or the allgather: the fused results are those of one tensor holding the
    concatenation, bit for bit, over two steps."""
    fused = fused_step(3, hc.ErrorFeedback(hc.OneBit()), steps=2, collective=collective)

    def body(comm):
        engine = Exchange(hc.ErrorFeedback(hc.OneBit()), OPS, comm, log_plan=False, collective=collective)
        state, out = {}, []
        for step in range(2):
            flat = torch.from_numpy(np.concatenate(list(grads(comm.rank, step).values())))
            info = TensorInfo(name="fused[a.bias..b.weight]", numel=flat.numel(), world=3, rank=comm.rank,
                              shape=(flat.numel(),))
            out.append(engine.finish(engine.start([engine.compress("flat", flat, state, info)]))[0].total.numpy().copy())
        return out, comm.log
    for r, (one, log) in enumerate(run_ranks(3, body)):
        for step in range(2):
            np.testing.assert_array_equal(np.concatenate(list(fused[r][0][step].values())), one[step])
        assert [c for c, _, _ in fused[r][1]] == [c for c, _, _ in log]
    assert [c for c, _, _ in fused[0][1]][:2] == (["alltoall", "allgather"] if collective == "alltoall"
                                                  else ["allgather", "allgather"])


def test_a_fused_bucket_through_two_levels_is_one_tensor_of_its_concatenation():
    """Two-level (2 nodes x 2 ranks; fp16 inside nodes, error-fed onebit between them): the fused
    bucket's results are those of one tensor holding the concatenation, bit for bit, over two
    steps, and its state (the node shard's residual) sits in the bucket's state."""
    bucket = buckets(tensors(), 10 ** 6)[0]

    def engine(node, cross):
        return two_level(hc.ErrorFeedback(hc.OneBit()), hc.FP16(), OPS, lambda: (node, cross))

    def body(world, node, cross):
        fused, plain = engine(node, cross), engine(node, cross)
        fused_state, plain_state, got, want = {}, {}, [], []
        for step in range(2):
            items = [(n, torch.from_numpy(g), TensorInfo(name=n, numel=g.size, world=4, rank=world.rank,
                                                         shape=g.shape))
                     for n, g in grads(world.rank, step).items()]
            done = fused.finish(fused.start([compress_bucket(fused, bucket, items, fused_state)]))
            got.append(np.concatenate([t.numpy() for _, t in totals(OPS, done[0])]))
            flat = torch.from_numpy(np.concatenate(list(grads(world.rank, step).values())))
            info = TensorInfo(name=bucket.name, numel=flat.numel(), world=4, rank=world.rank, shape=(flat.numel(),))
            want.append(plain.finish(plain.start([plain.compress("b", flat, plain_state, info)]))[0].total.numpy())
            fused.end_step()
            plain.end_step()
        return got, want, sorted(fused_state), sorted(plain_state)
    for got, want, fused_keys, plain_keys in run_nodes(2, 2, body):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        assert fused_keys == plain_keys and any(k.startswith("cross.") for k in fused_keys)


def test_auto_plans_a_bucket_as_one_tensor():
    """compression="auto" with fusion: the plan holds the bucket, not its members, and the bucket's
    totals are those of a plain engine running the pick on the concatenation (3 ranks, 2 steps)."""
    from hvdcompress.auto import CHOICES

    bucket = buckets(tensors(), 10 ** 6)[0]

    def body(comm):
        auto = Auto(allowed=["none", "fp16", "int8"], link="100mbit,50us", calibration=None, replan=False)
        engine, state, got = Exchange(auto, OPS, comm, log_plan=False), {}, []
        for step in range(2):
            items = [(n, torch.from_numpy(g), TensorInfo(name=n, numel=g.size, world=3, rank=comm.rank, shape=g.shape))
                     for n, g in grads(comm.rank, step).items()]
            done = engine.finish(engine.start([compress_bucket(engine, bucket, items, state)]))
            got.append(np.concatenate([t.numpy() for _, t in totals(OPS, done[0])]))
            engine.end_step()
        label, collective = auto.plan[bucket.name]
        plain = Exchange(hc.from_params(CHOICES[label]), OPS, comm, log_plan=False,
                         collective="auto" if collective == "allreduce" else collective)
        own, want = {}, []
        for step in range(2):
            flat = torch.from_numpy(np.concatenate(list(grads(comm.rank, step).values())))
            info = TensorInfo(name=bucket.name, numel=flat.numel(), world=3, rank=comm.rank, shape=(flat.numel(),))
            want.append(plain.finish(plain.start([plain.compress("b", flat, own, info)]))[0].total.numpy())
        return sorted(auto.plan), got, want
    for plan, got, want in run_ranks(3, body):
        assert plan == [bucket.name]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
