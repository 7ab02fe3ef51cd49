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
* a checkpoint (gathered, or this rank's) resumes on the same bits; a gathered one (every rank's
  state, the same on every rank) resumes at another mesh (1 x 4, 4 x 1; 2 ranks as 1 x 2, 2 x 1:
  tests/fsdp/hsdp_remesh.py): each rank's residual is its new shard of the mean of the replicas'
  (the unsent mass entering the average kept), m and v its new shard of the old ones, bit for bit;
  the run goes on with the replicas bit-identical; a checkpoint that cannot load is refused;
* the replica check raises on every rank; FSDP1 HYBRID_SHARD is refused naming the FSDP2 route;
* ``intra_node=`` (tests/fsdp/hsdp_in_node.py): a lossless in-node compressor gives intra_node=None's
  bits; int8 / bf16 inside the node keep the replicas bit-identical, with exact in-node bytes and the
  cross-node bytes unchanged; an in-node int8 + EF state resumes on the same bits; the compressors
  and checkpoints it cannot take are refused, changing nothing.
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
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]   # SHAPES' parameters
REMESH = {"1x4": (1, 4), "4x1": (4, 1), "1x2": (1, 2), "2x1": (2, 1)}   # tests/fsdp/hsdp_remesh.py
MORE = 2   # tests/fsdp/hsdp_remesh.py: steps trained after the load


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


def flat_rows(shape: tuple, shards: int, shard: int) -> tuple:
    """FSDP2's Shard(0) shard as flat elements [start, stop): torch.chunk's ceil(d0 / S) rows a
    shard, the last ones short or empty (d0 = 5 at 4 shards: 2, 2, 1, 0 rows)."""
    rows, inner = math.ceil(shape[0] / shards), math.prod(shape[1:])
    return min(shard * rows, shape[0]) * inner, min((shard + 1) * rows, shape[0]) * inner


def whole(state: dict, key: str, numel: int) -> np.ndarray:
    """A coordinate entry of one rank's state over its local shard: the entry, or the compressed
    allreduce's segments (seg<k>.key) concatenated and cut; zeros where the rank has none."""
    if key in state:
        return f32(state[key])
    segments = sorted((int(k[3:k.index(".")]), v) for k, v in state.items() if k.startswith("seg") and k.endswith("." + key))
    assert not any(k.startswith("sum.") for k in state), sorted(state)   # a load leaves no server residual
    return f32([x for _, v in segments for x in v])[:numel] if segments else np.zeros(numel, np.float32)


def saved_full(grid: list, name: str, shape: tuple, replica: int, key: str) -> np.ndarray:
    """The saved 2 x 2 checkpoint's ``key`` of ``name`` on ``replica``, over the whole parameter."""
    return np.concatenate([whole(grid[j][replica][name], key, flat_rows(shape, 2, j)[1] - flat_rows(shape, 2, j)[0])
                           for j in range(2)])


def test_gathered_checkpoint_holds_every_ranks_state_the_same_on_every_rank(runs):
    saved = runs["remesh:saved"]
    for rank in range(4):
        assert saved[rank]["grid"] == saved[0]["grid"], f"rank {rank}"
        assert saved[rank]["mesh"] == {"replicas": 2, "shards": 2}
        assert saved[rank]["own_mesh"] == {"replicas": 2, "shards": 2, "replica": rank // 2, "shard": rank % 2}
    grid = saved[0]["grid"]
    for j in range(2):
        for r in range(2):
            assert [len(grid[j][r][n]["residual"]) for n in NAMES] == shard_numels(j, padded=False)
    assert np.abs(saved_full(grid, "0.weight", SHAPES[0], 0, "residual")).max() > 0   # onebit left mass


@pytest.mark.parametrize("case", sorted(REMESH))
def test_resume_at_another_mesh_keeps_the_unsent_mass_and_adams_moments(runs, case):
    """The replicas' residuals pool (the store's rule at op=Average: every new rank gets T / R, so
    Σ_r' e'_r' / R' = Σ_r e_r / R; at R' = R each keeps its own), each rank its own shard of it;
    m, v and adam.unit carried."""
    replicas, shards = REMESH[case]
    grid = runs["remesh:saved"][0]["grid"]
    records = [runs[f"remesh:{case}"][rank] for rank in range(replicas * shards)]
    assert all(runs[f"remesh:{case}"][rank]["idle"] for rank in range(replicas * shards, 4))
    for name, shape in zip(NAMES, SHAPES):
        old = [saved_full(grid, name, shape, r, "residual") for r in range(2)]
        share = ((old[0].astype(np.float64) + old[1]) / 2).astype(np.float32)
        moments = {key: saved_full(grid, name, shape, 0, key) for key in ("adam.m", "adam.v")}
        for key, value in moments.items():   # the replicas held the same moments
            np.testing.assert_array_equal(saved_full(grid, name, shape, 1, key), value)
        mass = np.zeros(share.size)
        for rank, record in enumerate(records):
            assert (record["replica"], record["shard"]) == divmod(rank, shards)
            start, stop = flat_rows(shape, shards, record["shard"])
            state = record["loaded"][name]
            residual = whole(state, "residual", stop - start)
            # at the same number of replicas and a whole-shard layout each replica keeps its own
            mine = old[record["replica"]] if replicas == 2 and "residual" in state else share
            np.testing.assert_array_equal(residual, mine[start:stop], err_msg=f"{case} rank {rank} {name}")
            mass[start:stop] += residual.astype(np.float64) / replicas
            for key, value in moments.items():
                np.testing.assert_array_equal(f32(state[key]), value[start:stop], err_msg=f"{case} rank {rank} {name} {key}")
            assert state["adam.unit"] == grid[0][0][name]["adam.unit"]
        np.testing.assert_allclose(mass, (old[0].astype(np.float64) + old[1]) / 2, rtol=1e-6, atol=1e-12,
                                   err_msg=f"{case} {name}: the unsent mass changed")


@pytest.mark.parametrize("case", sorted(REMESH))
def test_training_goes_on_at_another_mesh_with_the_replicas_bit_identical(runs, case):
    replicas, shards = REMESH[case]
    records = [runs[f"remesh:{case}"][rank] for rank in range(replicas * shards)]
    for record in records:
        steps = [f32(s) for s in record["shards"]]
        assert len(steps) == MORE and all(np.isfinite(s).all() for s in steps)
        assert not np.array_equal(steps[0], steps[1])
    for rank, record in enumerate(records[shards:], start=shards):   # replica r > 0 against replica 0
        for step, (x, y) in enumerate(zip(record["shards"], records[rank % shards]["shards"])):
            np.testing.assert_array_equal(f32(x), f32(y), err_msg=f"{case} rank {rank} step {step}")


@pytest.mark.parametrize("case", sorted(REMESH))
def test_a_checkpoint_that_cannot_resume_at_another_mesh_is_refused_and_changes_nothing(runs, case):
    replicas, shards = REMESH[case]
    for rank in range(replicas * shards):
        record = runs[f"remesh:{case}"][rank]
        one, corrupt = record["errors"]["one_rank"], record["errors"]["corrupt"]
        assert "holds one rank's compressor state" in one and "state_dict(gather=True)" in one, one
        assert "entry 'residual' of tensor '2.weight' (replica 1, shard 1) holds 503 elements; expected 504" in corrupt, corrupt
        assert record["untouched_by_refusals"] and record["kept_after_a_refusal"], record


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


# ---- intra_node=: FSDP's in-node reduce-scatter compressed too (tests/fsdp/hsdp_in_node.py) ---------------
#: each unit's flat reduce-scatter input (FSDP2 pads dim 0 to a multiple of the 2 shards): per Linear,
#: its weight's and bias's padded elements; what FSDP reduce-scatters per rank and step, in float32
UNITS = [64 * 24 + 64, 18 * 63 + 18, 6 * 17 + 6]


def test_in_node_lossless_equals_intra_node_none(runs):
    """A lossless in-node compressor ({'compressor': 'none'}, NoCompression()) gives intra_node=None's bits:
    FSDP's AVG over the shard group is the compressed reduce-scatter's float32 sum times 1/2 (exact)."""
    for case, reference in (("in_node:none_sgd", "none_sgd"), ("in_node:none_frozen", "onebit_frozen")):
        for rank in range(4):
            got, want = runs[case][rank]["shards"], runs[reference][rank]["shards"]
            assert len(got) == len(want) == STEPS
            for step, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(f32(a), f32(b), err_msg=f"{case} rank {rank} step {step}")
            assert runs[case][rank]["in_node"] == {"dense": 4 * STEPS * sum(UNITS), "sent": 4 * STEPS * sum(UNITS),
                                                   "steps": STEPS, "ratio": 1.0}


@pytest.mark.parametrize("case", ["in_node:int8_frozen", "in_node:bf16_int8"])
def test_in_node_compression_keeps_the_replicas_bit_identical(runs, case):
    for a, b in PAIRS:
        for step, (x, y) in enumerate(zip(runs[case][a]["shards"], runs[case][b]["shards"])):
            np.testing.assert_array_equal(f32(x), f32(y), err_msg=f"{case} ranks {a},{b} step {step}")
    reference = {"in_node:int8_frozen": "onebit_frozen", "in_node:bf16_int8": "int8"}[case]
    for rank in range(4):
        steps = [f32(s) for s in runs[case][rank]["shards"]]
        assert len(steps) == STEPS and all(np.isfinite(s).all() for s in steps)
        # the in-node compressor changed the run (else the equality above proves nothing new); bf16
        # inside the node (SGD) only a little (onebit + FrozenAdam amplifies any change: sign flips)
        want = f32(runs[reference][rank]["shards"][-1])
        assert not np.array_equal(steps[-1], want)
        if case == "in_node:bf16_int8":
            np.testing.assert_allclose(steps[-1], want, atol=1e-3)


def test_in_node_bytes_and_cross_node_bytes(runs):
    """in_node_bytes: the in-node reduce-scatter (dense = the float32 flat inputs; int8 sends a byte
    an element and min/max per block: one block per chunk here, 2 chunks a unit); cross_node_bytes
    as without intra_node=; total_bytes both."""
    for rank in range(4):
        record = runs["in_node:int8_frozen"][rank]
        assert record["in_node"]["dense"] == 4 * STEPS * sum(UNITS)   # 11440 bytes a step
        assert record["in_node"]["sent"] == STEPS * (sum(UNITS) + 2 * 8 * len(UNITS))   # 2908 bytes a step
        assert 3.9 < record["in_node"]["ratio"] < 4
        assert record["cross_node"] == runs["onebit_frozen"][rank]["cross_node"]   # unchanged in meaning
        total = record["bytes"]
        assert total["sent"] == record["cross_node"]["sent"] + record["in_node"]["sent"]
        assert total["dense"] == runs["onebit_frozen"][rank]["bytes"]["dense"] + record["in_node"]["dense"]
        assert record["last_step"]["sent"] < total["sent"] and record["last_step"]["steps"] == 1
        bf16 = runs["in_node:bf16_int8"][rank]
        assert bf16["in_node"]["sent"] * 2 == bf16["in_node"]["dense"]
        assert bf16["cross_node"] == runs["int8"][rank]["cross_node"]


@pytest.mark.parametrize("case", ["gathered", "local"])
def test_in_node_checkpoint_resumes_on_the_same_bits(runs, case):
    """int8 + EF inside the node (a residual per rank, unit, chunk and block), FrozenAdam across."""
    loaded = []
    for rank in range(4):
        record = runs[f"in_node:resume_{case}"][rank]
        assert "in_node" in record["keys"]
        np.testing.assert_array_equal(f32(record["resumed"]), f32(record["straight"]), err_msg=f"rank {rank}")
        residuals = record["loaded_residuals"]
        assert sorted(residuals) == ["0", "2", "4"]
        assert all(np.abs(f32(v)).max() > 0 for st in residuals.values() for v in st.values())
        loaded.append(residuals)
        saved = record["saved_residuals"]
        if case == "gathered":   # every rank's, the same on every rank: [replica][shard]
            assert saved == runs["in_node:resume_gathered"][0]["saved_residuals"]
            assert saved[rank // 2][rank % 2] == residuals
        else:
            assert saved == residuals
    assert all(loaded[a] != loaded[b] for a in range(4) for b in range(a))   # per rank, not shared


def test_in_node_refuses_what_the_sharded_reduce_scatter_cannot_run(runs):
    for rank in range(4):
        record = runs["in_node:refusals"][rank]
        for label, names in (("dgc", "takes the optimizer's momentum or Adam over"),
                             ("frozen", "takes the optimizer's momentum or Adam over"),
                             ("powersgd", "PowerSGD and CSC need several rounds")):
            message = record[label]
            assert message.startswith("compress: intra_node=") and names in message, (label, message)
            assert "shard dimension" in message
        assert "intra_node= with scaler=" in record["scaler"]
        assert record["compress_after_refusals"] == "no error"   # FSDP was left as it was


def test_in_node_checkpoint_refusals_change_nothing(runs):
    for rank in range(4):
        record = runs["in_node:refusals"][rank]
        assert "resumes at the same mesh only" in record["other_mesh"] and "1 x 4" in record["other_mesh"]
        assert "holds 503 elements; expected 504" in record["corrupt_cross_node"]
        assert "entry 'version' holds 999" in record["bad_version"]   # after the in-node load: put back
        assert record["unchanged"] and record["residuals_nonzero"], record
        assert "pass the same intra_node=" in record["into_no_in_node"]
        assert record["fresh_in_node_empty"] and record["afresh"], record
