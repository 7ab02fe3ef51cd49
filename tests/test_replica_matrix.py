"""Replicas stay bit-identical (issue 19), under real Horovod processes, in few launches:

* 2 ranks: every registered compressor x {SGD momentum, SGD Nesterov, AdamW} x {no clip,
  clip_grad_norm}, each of these 6 cases of a compressor with the next of {step(),
  synchronize() + skip_synchronize()} x {backward_passes_per_step 1, 2} in turn (so every
  compressor meets all four, and every optimizer and clip setting meets all four), STEPS (10) steps
  each; decorated compressors, the Adam take-over (FrozenAdam, both placements); Horovod's own fp16 next to hvdcompress's FP16/BF16; the replica guard
  (check_replicas) catching a one-bit difference.
* 3 ranks: the compressed allreduce (collective='alltoall' for every compressor that runs it),
  process_set=, and sparse embeddings (Horovod's sparse path and sparse_as_dense).
* 4 ranks: two-level compression at 2 nodes x 2.
The TensorFlow tape and Keras fit are in tests/test_tf_replicas.py (run on Keras 2 and 3).

Each rank reports a digest of its parameters after every step (through its result file); a case
passes when every rank of the case's process set has the same digests at every step. The
scripts also run check_replicas=10, which raises on a drift."""
from __future__ import annotations

import itertools
import json

import pytest
from conftest import run_horovod

import hvdcompress

pytestmark = pytest.mark.horovod
STEPS = 10  # a rank-dependent order shows at the first step; 10 steps still carry residuals,
#            momentum, the warm-up and freeze schedules set below, and the check_replicas=10 guard
CLIP = 0.5


def first_drift(by_rank: dict, members: list) -> int | None:
    """The first step (1-based) at which the members' digests differ, or None."""
    rows = [by_rank[r]["digests"] for r in members]
    assert all(len(row) == len(rows[0]) for row in rows)
    return next((i + 1 for i in range(len(rows[0])) if len({row[i] for row in rows}) > 1), None)


def by_case(records: list) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(json.dumps(r["case"], sort_keys=True), {})[r["rank"]] = r
    return out


def launch(np: int, cases: list, timeout: int = 600, steps: int = STEPS, **cfg) -> dict:
    return by_case(run_horovod("torch_replica_matrix.py", np=np, timeout=timeout,
                               args=[json.dumps({"cases": cases, "steps": steps, **cfg})]))


def check_identical(results: dict, cases: list, np: int) -> None:
    """Every case reported by every rank, trained (moved, finite), and identical on its set."""
    drifted = []
    for case in cases:
        key = json.dumps(case, sort_keys=True)
        assert key in results and len(results[key]) == np, f"no result from every rank for {case}"
        ranks = results[key]
        members = ranks[0]["members"]
        assert ranks[members[0]]["finite"] and ranks[members[0]]["moved"] > 0, case
        step = first_drift(ranks, members)
        if step is not None:
            drifted.append((case, step))
    assert not drifted, f"{len(drifted)} case(s) drift (case, first step): {drifted[:10]}"


MODES = list(itertools.product(("step", "sync"), (1, 2)))  # (how to step, backward passes)
SETTINGS = list(itertools.product(("momentum", "nesterov", "adamw"), (None, CLIP)))
MATRIX = [dict(spec={"compressor": name}, optimizer=opt, clip=clip, mode=MODES[(c + j) % 4][0],
               passes=MODES[(c + j) % 4][1])
          for c, name in enumerate(hvdcompress.available())
          for j, (opt, clip) in enumerate(SETTINGS)]
# decorated and non-default settings, with and without clipping
DECORATED = [dict(spec=spec, optimizer=opt, clip=clip, mode="step", passes=1)
             for spec in ({"compressor": "topk", "k": "0.02", "ef": "vanilla"},
                          {"compressor": "topk", "k": "30", "ef": "vanilla", "momentum": "nesterov"},
                          {"compressor": "randomk", "k": "0.1", "seed": "3", "ef": "vanilla"},
                          {"compressor": "dgc", "sparsity": "0.99", "min_numel": "1000"},
                          {"compressor": "dgc", "sparsity": "0.999", "momentum": "nesterov",
                           "warmup_steps": "5"},
                          {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"},
                          {"compressor": "csc", "ratio": "0.05", "chunk": "64"})
             for opt, clip in (("momentum", CLIP), ("adamw", None))] + [
    dict(spec=spec, optimizer="adamw", clip=clip, mode="step", passes=1)
    for spec in ({"compressor": "onebit", "ef": "vanilla", "adam": "frozen", "freeze_steps": "5"},
                 {"compressor": "topk", "k": "0.02", "ef": "vanilla", "adam": "frozen",
                  "freeze_steps": "5", "adam_send": "gradient"},
                 {"compressor": "powersgd", "adam": "frozen", "freeze_steps": "5", "adam_send": "gradient"})
    for clip in (None, CLIP)]


@pytest.fixture(scope="module")
def two_ranks():
    return launch(2, MATRIX + DECORATED, timeout=900, horovod_fp16=True, guard=True)


def test_matrix_covers_every_compressor_and_feature():
    assert len(MATRIX) == len(hvdcompress.available()) * 3 * 2 >= 18 * 6
    for name in hvdcompress.available():  # every compressor meets every mode
        assert {(c["mode"], c["passes"]) for c in MATRIX if c["spec"]["compressor"] == name} == set(MODES)
    for opt, clip in SETTINGS:
        assert {(c["mode"], c["passes"]) for c in MATRIX
                if (c["optimizer"], c["clip"]) == (opt, clip)} == set(MODES)


def test_every_compressor_optimizer_clip_mode_and_accumulation_keeps_replicas_identical(two_ranks):
    check_identical(two_ranks, MATRIX, 2)


def test_decorated_compressors_keep_replicas_identical_and_send_fewer_bytes(two_ranks):
    check_identical(two_ranks, DECORATED, 2)
    for case in DECORATED:
        seen = two_ranks[json.dumps(case, sort_keys=True)][0]
        assert seen["sent"] < seen["dense"], case


def test_fp16_and_bf16_do_no_worse_than_horovods_fp16(two_ranks):
    horovod = first_drift(two_ranks[json.dumps({"horovod": "fp16"})], [0, 1])
    assert first_drift(two_ranks[json.dumps({"horovod": "none"})], [0, 1]) is None
    for name in ("fp16", "bf16"):
        ours = first_drift(two_ranks[json.dumps({"hvdcompress": name})], [0, 1])
        assert ours is None or (horovod is not None and ours >= horovod), (name, ours, horovod)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_guard_names_parameter_step_and_ranks_on_every_rank(two_ranks, how):
    ranks = two_ranks[json.dumps({"guard": how})]
    for r in (0, 1):
        error = ranks[r]["error"]
        assert error is not None, f"rank {r}: check_replicas did not see the flipped bit"
        assert "step 5" in error and "parameter '2.bias'" in error, error
        assert "ranks [0] hold" in error and "ranks [1] hold" in error, error
    assert ranks[0]["error"] == ranks[1]["error"]


ALLTOALL = [name for name in hvdcompress.available()
            if hvdcompress.from_params({"compressor": name}).supports_alltoall]
# At 3 and 4 ranks on 2 cores every collective costs ~13 ms of scheduling, so these launches
# fuse each step's tensors into one group (groups=1; the 2-rank matrix covers the default) and
# pair the options instead of crossing them.
THREE = ([dict(spec={"compressor": name}, optimizer=opt, clip=clip, mode="step", passes=1,
               collective="alltoall", groups=1)
          for name in ALLTOALL for opt, clip in (("nesterov", CLIP), ("adamw", None))]
         + [dict(spec={"compressor": name}, optimizer=opt, clip=clip, mode=mode, passes=1,
                 process_set=0, groups=1)
            for name, opt, clip, mode in (("none", "momentum", CLIP, "sync"), ("int8", "adamw", None, "step"),
                                          ("dgc", "nesterov", CLIP, "step"), ("powersgd", "momentum", None, "sync"))]
         + [dict(spec={"compressor": name}, optimizer="sparse-sgd", clip=clip, mode="step", passes=passes,
                 model="embedding", sparse_as_dense=dense)
            for name, dense, clip, passes in (("none", False, CLIP, 1), ("fp16", False, None, 2),
                                              ("int8", True, CLIP, 2), ("dgc", True, None, 1),
                                              ("topk", True, CLIP, 1))])


def test_compressed_allreduce_process_sets_and_sparse_embeddings_at_three_ranks():
    assert {"int8", "onebit", "bf16"} <= set(ALLTOALL)
    results = launch(3, THREE, timeout=900, process_sets=[[0, 2]])
    check_identical(results, THREE, 3)


TWO_LEVEL = [dict(spec=spec, optimizer=opt, clip=clip, mode="step", passes=1, intra_node=intra, groups=1)
             for spec, intra, opt, clip in (
                 ({"compressor": "dgc"}, {"compressor": "fp16"}, "nesterov", CLIP),
                 ({"compressor": "onebit", "ef": "vanilla"}, {"compressor": "none"}, "adamw", None),
                 ({"compressor": "int8"}, {"compressor": "fp16"}, "adamw", CLIP),
                 ({"compressor": "powersgd"}, {"compressor": "none"}, "momentum", None))]


def test_two_level_at_two_nodes_of_two():
    results = launch(4, TWO_LEVEL, timeout=900, ranks_per_node=2)
    check_identical(results, TWO_LEVEL, 4)

