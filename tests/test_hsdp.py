"""hvdcompress.torch.hsdp: FSDP2 HSDP with the replicate all-reduce compressed, in one torchrun
launch of 4 Gloo ranks as 2 replicas x 2 shards (tests/fsdp/hsdp_worker.py; rank = 2·replica +
shard, so ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1).

* NoCompression gives the parameters of FSDP's own HSDP (same model, batches, optimizer) bit for
  bit, with SGD and AdamW: FSDP's reduce-scatter is the same in both, and the mean of 2 replicas
  is one float addition (which commutes) and an exact halving in either;
* every compressed run (onebit + EF with FrozenAdam on AdamW, top-k + EF, DGC's momentum
  take-over on SGD, onebit + EF, int8) keeps each shard bit-identical across the replicas
  after every step (and ``check_replicas=1`` compares them inside the run);
* error feedback conserves the mass on a shard: R·average + Σ residuals = Σ (gradient + old residual);
* bytes: ``cross_node_bytes.dense`` is what FSDP's own all-reduce reduces (measured with
  ``set_all_reduce_hook`` on dense HSDP), ``sent`` the payloads, exactly as the codes' sizes;
* a checkpoint (gathered over the replicas, or this rank's) resumes on the same bits;
* the replica check raises on every rank; FSDP1 HYBRID_SHARD is refused naming the FSDP2 route.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_ddp import HERE, torchrun
from test_fsdp import by_case

from hvdcompress.torch import fsdp

WORKER = HERE / "fsdp" / "hsdp_worker.py"
STEPS = 6
PAIRS = [(0, 2), (1, 3)]   # the ranks of one shard, across the replicas
SHAPES = [(63, 24), (63,), (17, 63), (17,), (5, 17), (5,)]   # the worker's mlp()
COMPRESSED = ["onebit_frozen", "topk_ef", "dgc", "onebit_ef", "int8"]


@pytest.fixture(scope="module")
def runs() -> dict:
    return by_case(torchrun(4, WORKER, ["--steps", str(STEPS)], timeout=600))


def shard_numels(shard: int, padded: bool) -> list:
    """Elements of each parameter's shard ``shard`` of 2: dim 0 cut in ceil(d0/2) rows (FSDP2's
    Shard(0)); ``padded``: the last shard's padding rows counted (what FSDP's all-reduce sends)."""
    out = []
    for shape in SHAPES:
        rows = math.ceil(shape[0] / 2)
        mine = rows if padded else min(rows, shape[0] - shard * rows)
        out.append(mine * math.prod(shape[1:]))
    return out


def f32(values) -> np.ndarray:
    return np.asarray(values, np.float32)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_no_compression_equals_dense_hsdp(runs, optimizer):
    for rank in range(4):
        dense, none = runs[f"dense_{optimizer}"][rank]["shards"], runs[f"none_{optimizer}"][rank]["shards"]
        assert len(dense) == len(none) == STEPS
        for step, (a, b) in enumerate(zip(dense, none)):
            np.testing.assert_array_equal(f32(b), f32(a), err_msg=f"rank {rank} step {step}")


@pytest.mark.parametrize("case", COMPRESSED)
def test_shards_are_bit_identical_across_replicas(runs, case):
    for a, b in PAIRS:
        for step, (x, y) in enumerate(zip(runs[case][a]["shards"], runs[case][b]["shards"])):
            np.testing.assert_array_equal(f32(x), f32(y), err_msg=f"{case} ranks {a},{b} step {step}")
    # and the compressor changed the run (else the test above proves nothing)
    dense = runs["dense_adamw" if case == "onebit_frozen" else "dense_sgd"][0]["shards"][-1]
    assert not np.array_equal(f32(runs[case][0]["shards"][-1]), f32(dense))


def test_error_feedback_conserves_mass_on_a_shard(runs):
    """Top-k + EF, the first layer's weight shard: R·average + Σ_r e_r' = Σ_r (g_r + e_r)."""
    moved = 0.0
    for a, b in PAIRS:
        steps = [runs["topk_ef"][r]["conservation"] for r in (a, b)]
        assert len(steps[0]) == len(steps[1]) == STEPS
        for t in range(STEPS):
            records = [s[t] for s in steps]
            # the replicas' shard gradients differ as handed over: FSDP's all-reduce did not run
            assert not np.array_equal(f32(records[0]["grad"]), f32(records[1]["grad"]))
            before = sum(f32(r["grad"]) + (0 if r["residual_before"] is None else f32(r["residual_before"]))
                         for r in records)
            after = 2 * f32(records[0]["average"]) + sum(f32(r["residual_after"]) for r in records)
            np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-7, err_msg=f"ranks {a},{b} step {t}")
            np.testing.assert_array_equal(f32(records[0]["average"]), f32(records[1]["average"]))
            moved = max(moved, float(np.abs(f32(records[0]["residual_after"])).max()))
    assert moved > 0   # top-k 5% left mass in the residual


def test_cross_node_bytes_are_fsdps_all_reduce_and_the_payloads(runs):
    for rank in range(4):
        shard = rank % 2
        fsdp_bytes = sum(runs["dense_sgd"][rank]["fsdp_all_reduce"])
        assert fsdp_bytes == 4 * STEPS * sum(shard_numels(shard, padded=True))
        numels = shard_numels(shard, padded=False)
        payloads = {"none_sgd": sum(4 * n for n in numels),
                    "int8": sum(n + 8 for n in numels),             # codes and min/max per tensor
                    "onebit_ef": sum(-(-n // 8) + 4 for n in numels)}  # signs and a scale per tensor
        for case, per_step in payloads.items():
            cross, total = runs[case][rank]["cross_node"], runs[case][rank]["bytes"]
            assert cross["dense"] == fsdp_bytes and cross["steps"] == STEPS, (case, cross)
            assert cross["sent"] == total["sent"] == STEPS * per_step, (case, cross)
        assert runs["onebit_ef"][rank]["cross_node"]["ratio"] > 27
        assert runs["int8"][rank]["cross_node"]["ratio"] > 3.8
        assert runs["onebit_frozen"][rank]["cross_node"]["ratio"] > 8   # 2 int8 v-steps, then onebit


@pytest.mark.parametrize("case", ["frozen_gathered", "dgc_local"])
def test_checkpoint_resumes_on_the_same_bits(runs, case):
    for rank in range(4):
        record = runs[f"resume:{case}"][rank]
        np.testing.assert_array_equal(f32(record["resumed"]), f32(record["straight"]), err_msg=f"rank {rank}")


def test_scaler_gives_the_unscaled_run_and_an_overflow_skips_everywhere(runs):
    at = 3   # tests/fsdp/hsdp_worker.py OVERFLOW_AT
    for rank in range(4):
        scaled = runs["amp"][rank]["steps"]
        assert [s["shards"] for s in scaled] == runs["topk_ef"][rank]["shards"]   # exact unscaling
        steps = runs["amp_overflow"][rank]["steps"]
        assert steps[at - 1]["shards"] == scaled[at - 1]["shards"]
        assert steps[at]["shards"] == steps[at - 1]["shards"], f"rank {rank}: the overflow step moved the shards"
        assert steps[at]["scale"] == steps[at - 1]["scale"] / 2
        assert steps[at + 1]["shards"] != steps[at]["shards"]


def test_clip_after_the_exchange_is_torchs_clip_of_the_global_gradient(runs):
    for rank in range(4):
        clip = runs["clip"][rank]
        for step, (got, want) in enumerate(zip(clip["after"], clip["reference"])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank}, step {step}")


def test_clip_before_compression_clips_each_replicas_whole_gradient_on_every_rank(runs):
    """ErrorFeedback(NoCompression()) carries a state, so each replica's gradient (every shard of
    it, across the shard group) is clipped to CLIP * sqrt(R) before the exchange, then averaged."""
    clip, replicas = 0.05, 2   # tests/fsdp/hsdp_worker.py CLIP; the mesh (2 replicas x 2 shards)
    records = [runs["clip"][rank]["before"] for rank in range(4)]   # rank = replica * 2 + shard
    for step in range(STEPS):
        handed = [{n: np.array(v, np.float64) for n, v in records[rank][step]["handed"].items()} for rank in range(4)]
        coef = []
        for r in range(replicas):
            norm = math.sqrt(sum(float((g ** 2).sum()) for rank in (2 * r, 2 * r + 1) for g in handed[rank].values()))
            coef.append(min(1.0, clip * math.sqrt(replicas) / (norm + 1e-6)))
        assert min(coef) < 1.0, f"step {step}: the clip did not act ({coef})"
        for rank in range(4):
            shard = rank % 2
            for name, got in records[rank][step]["average"].items():
                want = (coef[0] * handed[shard][name] + coef[1] * handed[2 + shard][name]) / replicas
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8, err_msg=f"rank {rank}, step {step}, {name}")


def test_clip_is_refused_under_full_shard():
    net = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="clip_grad_norm=1.0 is HSDP's"):
        fsdp.compress(net, compression={"compressor": "int8"}, clip_grad_norm=1.0)


def test_replica_check_raises_on_every_rank(runs):
    for rank in range(4):
        message = runs["replicas_differ"][rank]["message"]
        assert "replicas differ at step 2" in message and "'0.weight'" in message, message


def test_fsdp1_hybrid_shard_names_the_fsdp2_route(runs):
    for rank in range(4):
        message = runs["refusal"][rank]["message"]
        assert "sharding_strategy=HYBRID_SHARD" in message, message
        assert "mesh_dim_names=('replicate', 'shard')" in message and "fully_shard(layer, mesh=mesh)" in message


def test_the_model_keeps_its_state_alive_and_frees_it_with_itself(runs):
    """A leak fixed: the parameters' hooks held the state (and the state the parameters) where
    Python's collector cannot see, so a dropped HSDP model was never freed."""
    for rank in range(4):
        record = runs["lifetime"][rank]
        assert record["steps_held_by_the_model"] == 2, record
        assert record["model_freed"] and record["state_freed"], record


def test_optimizer_is_refused_without_hsdp():
    net = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="optimizer= and collective= are HSDP's"):
        fsdp.compress(net, compression={"compressor": "int8"}, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
