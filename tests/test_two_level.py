"""Two-level compression (hvdcompress.engines.two_level) on the in-process simulator of nodes x ranks
(tests/simulator.py's run_nodes: a World per process set): NoCompression on both levels against
the flat exchange, FP16 inside the node + ErrorFeedback(OneBit) between nodes against a numpy
reference, DGC's momentum and weight decay on the node-summed shard against the flat DGC,
inter-node bytes, state keys and the argument checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from simulator import run_nodes
from test_exchange import onebit

import hvdcompress as hc
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.engines.exchange import Exchange
from hvdcompress.engines.two_level import two_level as two_level_engine
from hvdcompress.ops.torch_ops import TorchOps
from hvdcompress.step.options import check_intra_node, parse_options
from hvdcompress.transport import process_sets as psets
from hvdcompress.transport.process_sets import node_layout

OPS = TorchOps()
LAYOUTS = [(2, 2), (4, 4)]   # nodes x ranks per node: P = 4 and P = 16


def gradient(rank: int, n: int, step: int, integer: bool = False) -> np.ndarray:
    rng = np.random.default_rng(7919 * step + rank)
    if integer:
        return rng.integers(-1000, 1000, n).astype(np.float32)
    return rng.standard_normal(n).astype(np.float32)


def run(nodes: int, per_node: int, sizes: list, steps: int, make, integer: bool = False,
        param=None) -> list:
    """Each rank: ``make(world, node, cross)`` gives an engine; ``steps`` steps of one group of
    tensors of ``sizes``; returns per rank (results per step, engine, state dicts)."""
    def body(world, node, cross):
        engine = make(world, node, cross)
        states = [{} for _ in sizes]
        results = []
        for step in range(steps):
            entries = []
            for i, n in enumerate(sizes):
                info = TensorInfo(name=f"t{i}", numel=n, world=world.world, shape=(n,),
                                  rank=world.rank, momentum=0.9, weight_decay=0.01 if param else 0.0,
                                  param=None if param is None else torch.from_numpy(param(i, n)))
                x = torch.from_numpy(gradient(world.rank, n, 100 * step + i, integer))
                entries.append(engine.compress(i, x, states[i], info))
            engine.finish(engine.start(entries))
            engine.end_step()
            results.append([np.zeros(0, np.float32) if e.total is None else e.total.numpy().copy()
                            for e in entries])
        return results, engine, states
    return run_nodes(nodes, per_node, body)


def two_level(compressor, intra, collective="auto"):
    return lambda world, node, cross: two_level_engine(compressor, intra, OPS, lambda: (node, cross),
                                                       collective=collective)


def flat(compressor, collective="auto"):
    return lambda world, node, cross: Exchange(compressor, OPS, world, collective=collective)


@pytest.mark.parametrize("nodes,per_node", LAYOUTS)
def test_no_compression_on_both_levels_equals_the_flat_allreduce(nodes, per_node):
    """Integer-valued gradients: every partial sum is exact, so the two-level result
    ((r0 + r1) + (r2 + r3), then / P) equals the flat one (r0 + r1 + r2 + r3, then / P) bit for bit;
    sizes that L does not divide (padding) and an empty tensor included."""
    sizes = [10, 1001, 0, 64]
    got = run(nodes, per_node, sizes, 2, two_level(hc.NoCompression(), hc.NoCompression()), integer=True)
    want = run(nodes, per_node, sizes, 2, flat(hc.NoCompression()), integer=True)
    size = nodes * per_node
    for (results, _, _), (expected, _, _) in zip(got, want):
        for step, (a, b) in enumerate(zip(results, expected)):
            for i, (x, y) in enumerate(zip(a, b)):
                assert np.array_equal(x, y)
                total = sum(gradient(r, sizes[i], 100 * step + i, True) for r in range(size))
                assert np.array_equal(x, total / np.float32(size))


@pytest.mark.parametrize("nodes,per_node", LAYOUTS)
def test_no_compression_with_float_gradients_equals_flat_to_rounding(nodes, per_node):
    """Float gradients: the summation order differs, so equal to float32 rounding only."""
    got = run(nodes, per_node, [999], 1, two_level(hc.NoCompression(), hc.NoCompression()))
    want = run(nodes, per_node, [999], 1, flat(hc.NoCompression()))
    for (results, _, _), (expected, _, _) in zip(got, want):
        np.testing.assert_allclose(results[0][0], expected[0][0], rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(r[0][0][0], got[0][0][0][0]) for r in got)


def fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def reference_fp16_onebit(nodes: int, per_node: int, n: int, steps: int) -> list:
    """FP16 inside the node, ErrorFeedback(OneBit) between nodes, by hand: the node sums of
    fp16-decoded shards (local-rank order, float32), the 1-bit exchange of each shard with its
    residual (allgather at N = 2 nodes; the compressed allreduce with client and server
    residuals at N >= 3), fp16 of the result for the node's all-gather, / P."""
    size, m = nodes * per_node, -(-n // per_node)
    seg = -(-m // nodes)
    client = {}   # (local rank j, node k) -> residual of the shard (N = 2) or of its N segments
    server = {}   # (j, k) -> residual of segment k of shard j (N >= 3)
    out = []
    for step in range(steps):
        padded = []
        for r in range(size):
            p = np.zeros(per_node * m, np.float32)
            p[:n] = gradient(r, n, 100 * step)
            padded.append(p)
        result = np.zeros(per_node * m, np.float32)
        for j in range(per_node):
            shard = slice(j * m, (j + 1) * m)
            sums = []
            for k in range(nodes):
                total = fp16(padded[k * per_node][shard])
                for local in range(1, per_node):
                    total = total + fp16(padded[k * per_node + local][shard])
                sums.append(total)
            if nodes < 3:   # allgather of each node's 1-bit shard
                decoded = []
                for k in range(nodes):
                    q = sums[k] + client.get((j, k), 0)
                    c = onebit(q)
                    client[(j, k)] = q - c
                    decoded.append(c)
                t = decoded[0]
                for c in decoded[1:]:
                    t = t + c
            else:           # the compressed allreduce over the nodes
                decoded = []
                for k in range(nodes):
                    q = np.zeros(nodes * seg, np.float32)
                    q[:m] = sums[k]
                    q = q + client.get((j, k), 0)
                    c = np.concatenate([onebit(q[s * seg:(s + 1) * seg]) for s in range(nodes)])
                    client[(j, k)] = q - c
                    decoded.append(c)
                pieces = []
                for s in range(nodes):
                    part = decoded[0][s * seg:(s + 1) * seg]
                    for k in range(1, nodes):
                        part = part + decoded[k][s * seg:(s + 1) * seg]
                    part = part + server.get((j, s), 0)
                    d = onebit(part)
                    server[(j, s)] = part - d
                    pieces.append(d)
                t = np.concatenate(pieces)[:m]
            result[shard] = fp16(t)
        out.append(result[:n] * np.float32(1.0 / size))
    return out


@pytest.mark.parametrize("nodes,per_node,n", [(2, 2, 1000), (2, 2, 999), (4, 4, 1003)])
def test_fp16_inside_onebit_with_error_feedback_across_matches_numpy(nodes, per_node, n):
    runs = run(nodes, per_node, [n], 3, two_level(hc.ErrorFeedback(hc.OneBit()), hc.FP16()))
    want = reference_fp16_onebit(nodes, per_node, n, 3)
    for results, engine, states in runs:
        assert engine.cross.plan[f"t0#shard{engine.comm.rank}"][1] == ("allgather" if nodes < 3 else "alltoall")
        for got, expected in zip(results, want):
            np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-7)
    assert all(np.array_equal(r[0][-1][0], runs[0][0][-1][0]) for r in runs)


def test_collectives_of_one_step_and_state_keys():
    """Node all-to-all, cross-node rounds, node all-gather; the shard's state under 'cross.'
    (segments of the compressed allreduce at 4 nodes: 250-element shards, large enough for it
    to send fewer bytes than the allgather), in the tensor's own state dict."""
    def body(world, node, cross):
        engine = two_level_engine(hc.ErrorFeedback(hc.OneBit()), hc.FP16(), OPS, lambda: (node, cross))
        state = {}
        info = TensorInfo(name="w", numel=1000, world=16, shape=(1000,), rank=world.rank)
        engine.finish(engine.start([engine.compress("w", torch.ones(1000), state, info)]))
        return [c for c, _, _ in node.log], [c for c, _, _ in cross.log], sorted(state)
    node_log, cross_log, keys = run_nodes(4, 4, body)[5]
    assert node_log == ["alltoall", "allgather"] and cross_log == ["alltoall", "allgather"]
    assert keys == ["cross.seg0.residual", "cross.seg1.residual", "cross.seg2.residual",
                    "cross.seg3.residual", "cross.sum.residual"]


@pytest.mark.parametrize("nodes,per_node", LAYOUTS)
@pytest.mark.parametrize("compressor", [hc.NoCompression(), hc.ErrorFeedback(hc.OneBit())])
def test_inter_node_payload_per_rank_is_one_over_l_of_the_flat_one(nodes, per_node, compressor):
    """Same compressor and collective (allgather, or the allreduce for NoCompression): the
    payload each rank sends between nodes is 1/L of the flat exchange's (plus OneBit's 4-byte
    scale), and the node level's payloads are counted apart."""
    n = 4096
    collective = "auto" if isinstance(compressor, hc.NoCompression) else "allgather"
    got = run(nodes, per_node, [n], 1, two_level(compressor, hc.FP16(), collective))
    want = run(nodes, per_node, [n], 1, flat(compressor, collective))
    for (_, engine, _), (_, reference, _) in zip(got, want):
        sent, flat_sent = engine.last_step_bytes.sent, reference.last_step_bytes.sent
        assert engine.last_step_bytes.dense == reference.last_step_bytes.dense == 4 * n
        if isinstance(compressor, hc.NoCompression):
            assert sent * per_node == flat_sent == 4 * n
        else:
            assert sent == n // per_node // 8 + 4 and flat_sent == n // 8 + 4
        # fp16 inside the node: every shard to the all-to-all, the own reduced shard to the all-gather
        assert engine.last_node_bytes.sent == 2 * n + 2 * (n // per_node)


def test_dgc_momentum_and_weight_decay_apply_to_the_node_summed_shard():
    """DGC at sparsity 0 (dense, masking off) with the optimizer's momentum 0.9 and weight decay
    0.01: momentum on the node-summed shard with weight decay for L ranks (L·λ·w) equals the
    flat DGC's per-rank momentum summed, to float rounding, over 3 steps (momentum is linear)."""
    def param(i, n):
        return np.linspace(-1, 1, n, dtype=np.float32)
    dgc = lambda: hc.DGC(0.0, masking=False)  # noqa: E731
    got = run(2, 2, [1001], 3, two_level(dgc(), hc.NoCompression()), param=param)
    want = run(2, 2, [1001], 3, flat(dgc()), param=param)
    for (results, engine, states), (expected, _, _) in zip(got, want):
        assert sorted(states[0]) == ["cross.momentum", "cross.velocity"]
        for a, b in zip(results, expected):
            np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-6)
    without = run(2, 2, [1001], 3, two_level(dgc(), hc.NoCompression()))
    assert not np.allclose(without[0][0][-1][0], got[0][0][-1][0], rtol=1e-3)


@pytest.mark.parametrize("compressor", [hc.CSC(0.25, chunk=64, min_numel=0), hc.PowerSGD(rank=2)])
def test_multi_round_compressors_across_nodes(compressor):
    """CSC's and PowerSGD's rounds run over the cross-node set inside the two-level rounds: every
    rank ends with the same result, and the shard (rows 16 of a 32 x 64 matrix for PowerSGD)
    crosses nodes compressed."""
    def body(world, node, cross):
        engine = two_level_engine(compressor, hc.FP16(), OPS, lambda: (node, cross))
        state, out = {}, []
        for step in range(2):
            info = TensorInfo(name="m", numel=2048, world=4, shape=(32, 64), rank=world.rank, momentum=0.9)
            x = torch.from_numpy(gradient(world.rank, 2048, step))
            entry = engine.compress("m", x, state, info)
            engine.finish(engine.start([entry]))
            engine.end_step()
            out.append(entry.total.numpy().copy())
        return out, engine.last_step_bytes.sent, [c for c, _, _ in cross.log]
    runs = run_nodes(2, 2, body)
    for out, sent, log in runs:
        assert all(np.array_equal(a, b) for a, b in zip(out, runs[0][0]))
        assert sent < 4 * 1024 and len(log) >= 4   # below the dense shard's bytes; two rounds a step
        assert np.all(np.isfinite(out[-1])) and np.any(out[-1] != 0)


def test_plan_table_shows_both_levels():
    runs = run(2, 2, [4096], 1, two_level(hc.DGC(0.99, min_numel=0), hc.FP16()))
    table = runs[0][1].plan_table()
    assert "cross collective" in table and "t0 | 4096 | 8192 | allgather | 152 |" in table
    assert runs[0][1].describe() == "fp16 within nodes of 2, dgc across 2 nodes"


@pytest.mark.parametrize("value,message", [
    ("fp16", r"intra_node='fp16': allowed: None \(the flat exchange\) or an hvdcompress Compressor"),
    (hc.DGC(0.99), r"applies momentum"),
    (hc.TopK(0.01), r"intra_node=TopK.*fixed by the shard's"),
    (hc.Signum(), r"intra_node=Signum.*votes"),
    (hc.PowerSGD(), r"intra_node=PowerSGD.*several rounds"),
])
def test_bad_intra_node_is_a_value_error(value, message):
    with pytest.raises(ValueError, match=message):
        check_intra_node(value)


def test_good_intra_node_compressors():
    for c in (hc.NoCompression(), hc.FP16(), hc.BF16(), hc.Int8(), hc.ErrorFeedback(hc.OneBit())):
        assert check_intra_node(c) is c
    assert isinstance(check_intra_node({"compressor": "fp16"}), hc.FP16)


def test_node_layout():
    assert node_layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    nodes, cross = node_layout(16, 4)
    assert nodes[1] == [4, 5, 6, 7] and cross[3] == [3, 7, 11, 15]


@pytest.mark.parametrize("size,per_node", [(4, 3), (4, 1), (4, 4), (6, True)])
def test_bad_ranks_per_node_is_a_value_error(size, per_node):
    with pytest.raises(ValueError, match=rf"ranks_per_node={per_node!r} with {size} ranks.*divisor"):
        node_layout(size, per_node)


class FakeHorovod:
    """The few calls of Horovod's API that hvdcompress.engines.two_level makes, for one rank."""

    global_process_set = object()

    class ProcessSet:
        def __init__(self, ranks):
            self.ranks, self.process_set_id = list(ranks), None

    def __init__(self, size, local_size, rank, initialized=True, local_rank=None, cross_rank=None):
        self._size, self._local, self._rank, self._init = size, local_size, rank, initialized
        self._local_rank = rank % local_size if local_rank is None else local_rank
        self._cross_rank = rank // local_size if cross_rank is None else cross_rank
        self.added = []

    def is_initialized(self): return self._init
    def size(self): return self._size
    def local_size(self): return self._local
    def rank(self): return self._rank
    def local_rank(self): return self._local_rank
    def cross_rank(self): return self._cross_rank

    def add_process_set(self, ps):
        ps.process_set_id = len(self.added) + 1
        self.added.append(ps.ranks)
        return ps


@pytest.fixture
def fresh_sets(monkeypatch):
    monkeypatch.setattr(psets, "_SETS", {})
    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)


def test_node_process_sets_from_horovodrun_variables(fresh_sets, monkeypatch):
    monkeypatch.setenv("HOROVOD_SIZE", "8")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "4")
    hvd = FakeHorovod(8, 4, 0, initialized=False)
    sets = psets.node_process_sets(hvd)
    assert [ps.ranks for ps in sets] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 4], [1, 5], [2, 6], [3, 7]]
    assert psets.node_process_sets(hvd) is sets   # the same objects: registered once
    monkeypatch.delenv("HOROVOD_SIZE")
    monkeypatch.setattr(psets, "_SETS", {})
    with pytest.raises(ValueError, match="HOROVOD_SIZE is not set"):
        psets.node_process_sets(hvd)


def test_unregistered_process_sets_are_a_value_error_that_says_how(fresh_sets):
    with pytest.raises(ValueError, match=r"hvd.init\(process_sets=hvdcompress.torch.node_process_sets"
                                         r"\(ranks_per_node=2\)\).*HOROVOD_DYNAMIC_PROCESS_SETS=1"):
        psets.registered_node_sets(FakeHorovod(4, 4, 1), 2)


def test_registered_sets_are_found_and_dynamic_ones_added(fresh_sets, monkeypatch):
    hvd = FakeHorovod(4, 4, 3)
    for ps in psets.node_process_sets(hvd, 2):
        ps.process_set_id = 9
    node, cross = psets.registered_node_sets(hvd, 2)
    assert (node.ranks, cross.ranks, hvd.added) == ([2, 3], [1, 3], [])
    monkeypatch.setattr(psets, "_SETS", {})
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    node, cross = psets.registered_node_sets(hvd, 2)
    assert hvd.added == [[0, 1], [2, 3], [0, 2], [1, 3]] and cross.process_set_id == 4


def test_ranks_not_placed_node_by_node_are_a_value_error(fresh_sets, monkeypatch):
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    with pytest.raises(ValueError, match="rank 1 is local rank 0 on node 1, not 1 on 0"):
        psets.registered_node_sets(FakeHorovod(4, 2, 1, local_rank=0, cross_rank=1), None)


def test_two_level_argument_checks():
    def parse(**kwargs):
        return parse_options(hc.DGC(), op=0, average_op=0, sum_op=1, global_set="global", **kwargs)
    with pytest.raises(ValueError, match="ranks_per_node=2 without intra_node"):
        parse(process_set="global", ranks_per_node=2)
    with pytest.raises(ValueError, match="two-level compression runs over all ranks"):
        parse(process_set=object(), intra_node=hc.FP16())
    with pytest.raises(ValueError, match="intra_node=DGC"):
        parse(process_set="global", intra_node=hc.DGC())
    assert isinstance(parse(process_set="global", intra_node={"compressor": "fp16"}).intra_node, hc.FP16)
