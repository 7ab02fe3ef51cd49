"""hvdcompress.torch.fsdp: the compressed reduce-scatter under FSDP1 and FSDP2, in real torchrun
processes over Gloo (tests/fsdp/worker.py), against a numpy reference written here.

Every reduce-scatter call of every step (the unit's flat gradient on each rank, the shard each
rank got) is recomputed in numpy: each rank's P chunks cut into blocks of 256, each block
compressed with its own error-feedback residual carried over the steps, the P ranks' decoded
blocks summed in rank order in float32, times FSDP's 1/P. Bit for bit for none, fp16, int8 and
top-k + EF; onebit + EF to float rounding of its float64 mean. bf16 gradients (FSDP1's
MixedPrecision, FSDP2's MixedPrecisionPolicy) are compressed in float32 and the shard rounded
to bf16. Two-level (4 ranks, 2 per node): the node level's reduce-scatter, then the cross level's. Also: training losses and bytes against dense FSDP, a checkpoint resumed on the same
bits, the state laid out at another world size, and the refusals.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_ddp import HERE, torchrun
from test_kernels import np_minmax, np_topk_abs

import hvdcompress as hc
from hvdcompress.engines.reduce_scatter import laid_out, pooled_units
from hvdcompress.torch import fsdp

WORKER = HERE / "fsdp" / "worker.py"
BLOCK = 256
TWO = [f"{v}:{c}" for v in ("fsdp1", "fsdp2") for c in ("none", "fp16", "int8", "onebit_ef", "topk_ef")] + \
    ["fsdp1:int8_bf16", "fsdp2:onebit_ef_bf16"]
FOUR = ["fsdp1:onebit_ef", "fsdp2:int8", "fsdp2:topk_ef", "fsdp2:two_level_int8", "fsdp2:two_level_onebit_ef",
        "fsdp2:two_level_int8_ag"]


def by_case(records) -> dict:
    out: dict = {}
    for r in (r for per_rank in records for r in per_rank):
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


@pytest.fixture(scope="module")
def two():
    return by_case(torchrun(2, WORKER, ["--cases", ",".join(TWO), "--train", "fsdp1,fsdp2",
                                        "--resume", "fsdp1,fsdp2", "--amp"], timeout=600))


@pytest.fixture(scope="module")
def four():
    return by_case(torchrun(4, WORKER, ["--cases", ",".join(FOUR)], timeout=600))


def decode(name: str, piece: np.ndarray, residual: np.ndarray) -> tuple:
    """(what the block stands for, the new residual) of one rank's block."""
    f32 = np.float32
    if name == "none":
        return piece, residual
    if name == "fp16":
        return piece.astype(np.float16).astype(f32), residual
    if name == "int8":
        codes, bounds = np_minmax(piece, 2048)
        return bounds[0] + codes.astype(f32) * ((bounds[1] - bounds[0]) / f32(255)), residual
    p = piece + residual
    if name == "onebit_ef":
        s = f32(np.abs(p).astype(np.float64).sum() / p.size)
        d = np.where(np.signbit(p), -s, s).astype(f32)
    else:   # topk_ef, 5%
        k = min(p.size, max(1, math.ceil(round(0.05 * p.size, 6))))
        d = np.zeros_like(p)
        idx = np_topk_abs(p, k)[1]
        d[idx] = p[idx]
    return d, p - d


def reduce_scatter(inputs: list, name: str, residuals: dict, tag: tuple) -> list:
    """The numpy compressed reduce-scatter of one unit over ``len(inputs)`` members: member q's
    flat gradient cut into chunks and blocks of BLOCK, each block decoded with its residual
    (keyed by ``tag``, q, chunk, block), member j's chunk summed over the members in order."""
    world = len(inputs)
    length = inputs[0].size // world
    cuts = [min(BLOCK, length - s) for s in range(0, length, BLOCK)]
    decoded = {}
    for q in range(world):
        for j in range(world):
            start = j * length
            for b, width in enumerate(cuts):
                key = (*tag, q, j, b)
                decoded[(q, j, b)], residuals[key] = decode(name, inputs[q][start:start + width],
                                                            residuals.get(key, np.zeros(width, np.float32)))
                start += width
    out = []
    for j in range(world):
        blocks = []
        for b in range(len(cuts)):
            total = decoded[(0, j, b)]
            for q in range(1, world):
                total = total + decoded[(q, j, b)]
            blocks.append(total)
        out.append(np.concatenate(blocks))
    return out


def two_level(inputs: list, names: tuple, residuals: dict, unit: str, per_node: int = 2) -> list:
    """The two-level reference: inside each node (``names[0]``), the chunks of local index l
    (chunks n·L + l of every node n) to local rank l; then among the ranks of local index l
    across nodes (``names[1]``)."""
    world = len(inputs)
    nodes, size = world // per_node, inputs[0].size // world
    chunk = lambda x, c: x[c * size:(c + 1) * size]
    ordered = [np.concatenate([chunk(x, n * per_node + l) for l in range(per_node) for n in range(nodes)]) for x in inputs]
    node_sums = {}
    for n in range(nodes):
        members = list(range(n * per_node, (n + 1) * per_node))
        for l, y in enumerate(reduce_scatter([ordered[r] for r in members], names[0], residuals, ("node", unit, n))):
            node_sums[(n, l)] = y
    shards = {}
    for l in range(per_node):
        for n, shard in enumerate(reduce_scatter([node_sums[(m, l)] for m in range(nodes)], names[1], residuals,
                                                 ("cross", unit, l))):
            shards[n * per_node + l] = shard
    return [shards[r] for r in range(world)]


TWO_LEVEL = {"two_level_int8": ("none", "int8"), "two_level_onebit_ef": ("fp16", "onebit_ef"),
             "two_level_int8_ag": ("none", "int8")}


def check_against_reference(ranks: dict, case: str) -> None:
    version, name = case.split(":")
    bf16 = name.endswith("_bf16")
    name = name.removesuffix("_bf16")
    world = len(ranks)
    calls = [ranks[r]["calls"] for r in range(world)]
    assert len({len(c) for c in calls}) == 1 and len(calls[0]) >= 3
    residuals: dict = {}
    for position in range(len(calls[0])):
        unit = calls[0][position]["unit"]
        assert all(c[position]["unit"] == unit for c in calls), "ranks reduce units in different orders"
        inputs = [np.asarray(c[position]["input"], np.float32) for c in calls]
        sums = two_level(inputs, TWO_LEVEL[name], residuals, unit) if name in TWO_LEVEL else \
            reduce_scatter(inputs, name, residuals, (unit,))
        for j in range(world):
            want = torch.from_numpy(sums[j])
            if bf16:
                want = want.to(torch.bfloat16)
            want = (want * calls[j][position]["scale"]).float().numpy()
            got = np.asarray(calls[j][position]["output"], np.float32)
            if "onebit_ef" in name:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{case} {unit} rank {j}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{case} {unit} call {position} rank {j}")


@pytest.mark.parametrize("case", TWO)
def test_two_ranks_equal_the_numpy_reduce_scatter(two, case):
    check_against_reference(two[case], case)


@pytest.mark.parametrize("case", FOUR)
def test_four_ranks_equal_the_numpy_reduce_scatter(four, case):
    check_against_reference(four[case], case)


@pytest.mark.parametrize("case", ["fsdp2:two_level_int8", "fsdp2:two_level_int8_ag"])
def test_cross_node_bytes_are_the_other_nodes_share(four, case):
    """4 ranks, 2 nodes of 2 (P = 4, L = 2, N = 2): per reduce-scatter of n elements FSDP's own
    sends the other node's ranks (P - L)/P of 4n bytes; the cross level sends the other node's
    rank one chunk of n/P int8 codes, blocks of 256 with 8 bytes of bounds each; each gathered
    shard crosses to P - L ranks (dense and sent)."""
    world, per_node, nodes = 4, 2, 2
    for rank, record in four[case].items():
        dense = sent = 0
        for call in record["calls"]:
            n = len(call["input"])
            dense += 4 * n * (world - per_node) // world
            blocks = [min(BLOCK, n // world - start) for start in range(0, n // world, BLOCK)]
            sent += (nodes - 1) * sum(b + 8 * math.ceil(b / 2048) for b in blocks)
        gathered = record["gathered"]
        assert (gathered["sent"] > 0) == case.endswith("_ag")
        assert record["cross"]["dense"] == dense + (world - per_node) * gathered["dense"], (rank, record["cross"])
        assert record["cross"]["sent"] == sent + (world - per_node) * gathered["sent"], (rank, record["cross"])


def test_cross_node_bytes_need_the_nodes():
    with pytest.raises(ValueError, match="intra_node"):
        fsdp.CompressionState(compression=hc.Int8()).cross_node_bytes


@pytest.mark.parametrize("version", ["fsdp1", "fsdp2"])
def test_training_loss_and_bytes_against_dense_fsdp(two, version):
    dense = np.mean([np.mean(two[f"train:{version}:dense"][r]["losses"][-5:]) for r in range(2)])
    for name, loss_ratio, byte_ratio in (("int8", 1.02, 3), ("onebit_ef", 1.25, 10), ("topk_ef", 1.25, 10)):
        runs = two[f"train:{version}:{name}"]
        loss = np.mean([np.mean(runs[r]["losses"][-5:]) for r in range(2)])
        assert loss <= loss_ratio * dense, f"{version} {name}: {loss:.4f} against dense {dense:.4f}"
        counted = runs[0]["bytes"]
        assert counted["steps"] == 40 and counted["dense"] >= byte_ratio * counted["sent"], counted


@pytest.mark.parametrize("version", ["fsdp1", "fsdp2"])
def test_checkpoint_resumes_on_the_same_bits(two, version):
    for r in range(2):
        assert two[f"resume:{version}"][r]["resumed"] == two[f"resume:{version}"][r]["straight"]


def test_bytes_per_step_are_counted_once(two):
    for case in TWO:
        assert two[case][0]["bytes"]["steps"] == 3


def test_scaler_gives_the_unscaled_run_and_an_overflow_skips_the_step_everywhere(two):
    plain, scaled, overflow = (two[f"amp:{label}"] for label in ("plain", "scaled", "overflow"))
    for rank in (0, 1):
        # a power-of-two scale unscales exactly: the same bits as the run without a scaler
        assert [s["params"] for s in scaled[rank]["steps"]] == [s["params"] for s in plain[rank]["steps"]]
        assert [s["residual"] for s in scaled[rank]["steps"]] == [s["residual"] for s in plain[rank]["steps"]]
        steps = overflow[rank]["steps"]
        at = 3   # tests/fsdp/worker.py OVERFLOW_AT: rank 1's loss inf; every rank skips
        assert steps[at - 1]["params"] == scaled[rank]["steps"][at - 1]["params"]
        assert steps[at]["params"] == steps[at - 1]["params"], "the overflow step moved the parameters"
        assert steps[at]["residual"] == steps[at - 1]["residual"], "the overflow step kept its residuals"
        assert steps[at]["scale"] == steps[at - 1]["scale"] / 2
        assert steps[at + 1]["params"] != steps[at]["params"]   # training goes on
    assert overflow[0]["steps"][-1]["scale"] == overflow[1]["steps"][-1]["scale"]


def test_scaler_needs_the_optimizer_it_steps():
    with pytest.raises(ValueError, match="scaler=.*optimizer=None"):
        fsdp.CompressionState(compression=hc.Int8(), scaler=torch.amp.GradScaler("cpu"))


def test_another_world_size_pools_each_units_mass():
    """Two old ranks' residuals of one unit (chunks of 4, blocks of 2) at 3 new ranks: every new
    rank holds the old ranks' mean over the whole unit, cut into its own chunks and blocks."""
    rng = np.random.default_rng(0)
    old = [{"u": {f"c{j}.b{b}.residual": rng.standard_normal(2).astype(np.float32)
                  for j in range(2) for b in range(2)} | {"c0.b0.step": 5}} for _ in range(2)]
    whole = [np.concatenate([r["u"][f"c{j}.b{b}.residual"] for j in range(2) for b in range(2)]) for r in old]
    pooled = pooled_units(old)
    new = laid_out(pooled["u"], 9, 3, 2)   # 9 elements at 3 ranks: chunks of 3, blocks of 2 and 1
    mean = ((whole[0].astype(np.float64) + whole[1]) / 2).astype(np.float32)
    got = np.concatenate([new[f"c{j}.b{b}.residual"] for j in range(3) for b in range(2)])
    np.testing.assert_array_equal(got[:8], mean)
    assert got[8] == 0 and new["c2.b1.step"] == 5


@pytest.mark.parametrize("compression,words", [
    (hc.DGC(0.99), "DGC"), (hc.PowerSGD(rank=2), "PowerSGD"), (hc.FrozenAdam(hc.OneBit()), "optimizer state is sharded"),
    (hc.Momentum(hc.OneBit(), 0.9), "optimizer state is sharded"), (hc.Signum(), "signum"),
    ("auto", "fixed compressor")])
def test_compressors_that_cannot_run_sharded_are_refused(compression, words):
    with pytest.raises(ValueError, match=f"compression=.*{words}"):
        fsdp.CompressionState(compression=compression)


def test_bad_block_names_the_parameter():
    with pytest.raises(ValueError, match="block=0: allowed: an integer >= 1"):
        fsdp.CompressionState(compression=hc.Int8(), block=0)


def test_compress_needs_fsdp_modules():
    with pytest.raises(ValueError, match="no FSDPModule under Linear"):
        fsdp.compress(torch.nn.Linear(2, 2), compression=hc.Int8())


def test_example_trains_with_int8():
    """examples/fsdp_train.py, as the README runs it (fewer epochs)."""
    records = [r for per_rank in torchrun(2, HERE.parent / "examples" / "fsdp_train.py",
                                          ["--compression", "int8", "--epochs", "3", "--hidden", "128"],
                                          timeout=300) for r in per_rank]
    assert len(records) == 2 and all(r["accuracy"] > 0.8 for r in records)
    assert all(r["dense_bytes"] >= 3 * r["sent_bytes"] > 0 for r in records)
