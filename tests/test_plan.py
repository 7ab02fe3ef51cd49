"""hvdcompress.plan: the alpha-beta formulas against hand-written references, the unit parsers'
errors, the pipeline simulation on a hand-worked example, the calibration cache, the command
line and determinism."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdcompress.plan import (
    Cluster,
    Fusion,
    Job,
    Link,
    from_sizes,
    measure,
    parse_bandwidth,
    parse_latency,
    predict,
    recommend,
    simulate,
)
from hvdcompress.plan import calibration as cal
from hvdcompress.plan import collectives as coll
from hvdcompress.plan import cpu_share as cal_share
from hvdcompress.plan.exchanges import exchange
from hvdcompress.plan.pipeline import fused_time
from hvdcompress.transport.collectives import wire_bytes

ROOT = Path(__file__).resolve().parent.parent
LINK = Link(alpha_s=1e-5, beta_bytes_per_s=1e9)
FP16 = {"compressor": "fp16"}


# ---- formulas ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [2, 3, 8, 64])
def test_ring_formulas(ranks):
    b, a, beta = 4e6, LINK.alpha_s, LINK.beta_bytes_per_s
    ar = coll.allreduce(b, ranks, LINK)
    assert ar.total_s == pytest.approx(2 * (ranks - 1) * a + 2 * (ranks - 1) / ranks * b / beta)
    ag = coll.allgather(b, ranks, LINK)
    assert ag.total_s == pytest.approx((ranks - 1) * a + (ranks - 1) * b / beta)
    gloo = Link(LINK.alpha_s, LINK.beta_bytes_per_s, half_duplex_pairs=True)
    duplex = 2 if ranks == 2 else 1   # two ranks: one TCP pair, the directions take turns
    assert coll.allgather(b, ranks, gloo).total_s == pytest.approx((ranks - 1) * a + duplex * (ranks - 1) * b / beta)
    assert coll.alltoall(b, ranks, gloo).transfer_s == pytest.approx(2 * coll.alltoall(b, ranks, LINK).transfer_s)
    assert coll.allreduce(b, ranks, gloo) == ar
    assert (ar.wire_bytes, ag.wire_bytes) == (wire_bytes("allreduce", b, ranks), wire_bytes("allgather", b, ranks))


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_allreduce_adds_the_sums_of_the_reduce_scatter(ranks):
    b, gamma = 4e6, 2e-9                     # bytes, seconds per byte summed
    plain, summed = coll.allreduce(b, ranks, LINK), coll.allreduce(b, ranks, LINK, reduce_s=gamma * b)
    assert summed.transfer_s - plain.transfer_s == pytest.approx((ranks - 1) / ranks * b * gamma)
    assert summed.latency_s == plain.latency_s and summed.wire_bytes == plain.wire_bytes


def test_gamma_per_dtype_reaches_the_exchange():
    calibration = cal.Calibration("box", "cpu", {}, {"float32": 1e-10, "float16": 2e-9})
    parts = (("float16", 1000), ("float32", 400), ("int8", 100))   # int8: float32's gamma
    assert calibration.reduce_s(parts) == pytest.approx(1000 * 2e-9 + 500 * 1e-10)
    assert cal.Calibration("box", "cpu", {}).reduce_s(parts) == 0.0
    cluster = Cluster(1, 4, intra=LINK, inter=LINK)
    bare = exchange(FP16, (1000, 100), "allgather", "flat", cluster, FP16)
    summed = exchange(FP16, (1000, 100), "allgather", "flat", cluster, FP16, calibration)
    assert measure(FP16, (1000, 100)).dtypes == ((("float16", 2 * 100_000),),)
    extra = summed.rounds[0][1].transfer_s - bare.rounds[0][1].transfer_s
    assert extra == pytest.approx(3 / 4 * 2 * 100_000 * 2e-9)


def test_measure_reduction_numpy_reference():
    gamma = cal.measure_reduction(("float32", "float16"), numel=1 << 16, repeats=1)
    assert set(gamma) == {"float32", "float16"} and all(0 < g < 1e-6 for g in gamma.values())


def test_cpu_share_stretches_compute_codec_and_sums():
    assert cal_share(4, 2) == 2.0 and cal_share(1, 8) == 1.0 and cal_share(3, 2) == 1.5
    with pytest.raises(ValueError, match="cpu_share"):
        Cluster(1, 4, intra=LINK, inter=LINK, cpu_share=0.5)
    fast = Link(0.0, 1e18)
    profile = from_sizes([1000], compute_s=0.3, optimizer_s=0.1)
    times = cal.CodecTimes(cal.Fit(0.01, 0.0), cal.Fit(0.02, 0.0), cal.Fit(0.02, 0.0))
    calibration = cal.Calibration("box", "cpu", {cal.spec_key(FP16): times}, {"float16": 1e-6})
    rows = {}
    for share in (1.0, 2.0):
        cluster = Cluster(1, 4, intra=fast, inter=fast, cpu_share=share)
        plan = exchange(FP16, (1000,), "allgather", "flat", cluster, FP16, calibration)
        assert (plan.hook_s, plan.sync_s) == pytest.approx((0.01 * share, 0.02 * share))
        assert plan.rounds[0][1].transfer_s == pytest.approx(share * 3 / 4 * 2000 * 1e-6, rel=1e-6)
        rows[share] = predict(profile, cluster, {"fp16": FP16}, ("allgather",), ("flat",),
                              calibration=calibration, fusion=Fusion(0, 0.0))[0].step_time_s
    # one tensor, ready at the backward's end: compute + compress + sums + decode, all CPU work
    assert rows[2.0] == pytest.approx(2 * rows[1.0], rel=1e-6)


def test_calibrations_run_together_are_averaged(tmp_path):
    one = cal.Calibration("box", "cpu", {"k": cal.CodecTimes(cal.Fit(1, 2), cal.Fit(3, 4), cal.Fit(5, 6))},
                          {"float32": 1.0})
    two = cal.Calibration("box", "cpu", {"k": cal.CodecTimes(cal.Fit(3, 4), cal.Fit(5, 6), cal.Fit(7, 8))},
                          {"float32": 3.0})
    mean = cal._average([one, two])
    assert mean.codecs["k"] == cal.CodecTimes(cal.Fit(2, 3), cal.Fit(4, 5), cal.Fit(6, 7))
    assert (mean.reduce, mean.processes) == ({"float32": 2.0}, 2)
    together = cal.calibrate([FP16], sizes=(256, 1024), repeats=1, device="cpu", processes=2)
    assert together.processes == 2 and together.times(FP16) is not None and together.reduce
    path = cal.save(together, cal.cache_path("cpu", tmp_path, host="box", processes=2))
    assert path.name == "calibration-box-cpu-x2.json" and cal.load(path) == together


# ---- front ends: gradient copies and the cost per tensor -------------------------------------------
INT8 = {"compressor": "int8"}
NONE = {"compressor": "none"}


def _one_step(spec, profile, calibration, front_end) -> float:
    from hvdcompress.plan.front_ends import FRONT_ENDS
    fast = Link(0.0, 1e18)
    return predict(profile, Cluster(1, 2, intra=fast, inter=fast), {"x": spec}, ("allgather",), ("flat",),
                   calibration=calibration, fusion=Fusion(0, 0.0), front_end=FRONT_ENDS[front_end])[0].step_time_s


def test_ddp_copies_each_gradient_twice_and_a_compressed_one_three_times():
    """DDP copies every gradient into its bucket (in the backward) and back into .grad; a hook
    that does not reduce in place writes its decoded average into the bucket too. With a free
    link and no codec, DDP's step less Horovod's is passes x 4 bytes x n x the copy's cost."""
    n, copy = 10_000, 2e-10
    calibration = cal.Calibration("box", "cpu", {}, copy_s_per_byte=copy)
    profile = from_sizes([n], compute_s=0.0)
    for spec, passes in ((NONE, 2), (INT8, 3)):
        extra = _one_step(spec, profile, calibration, "ddp") - _one_step(spec, profile, calibration, "horovod")
        assert extra == pytest.approx(passes * 4 * n * copy), spec
    assert cal.Calibration.from_json(calibration.to_json()).copy_s_per_byte == copy
    assert 0 < cal.measure_copy(numel=1 << 16, repeats=1) < 1e-6


def test_cost_per_tensor_per_bucket_member_and_not_for_ddps_own_dense():
    """``per_tensor`` per exchanged tensor; a fused bucket of m members: per_tensor + (m-1) x
    per_member; DDP's own dense exchange (its C++ reducer) pays none, Horovod's does."""
    from hvdcompress.plan.profile import fused
    per_tensor, per_member = {cal.spec_key(INT8): 3e-4, cal.spec_key(NONE): 1e-4}, {cal.spec_key(INT8): 5e-5}
    calibration = cal.Calibration("box", "cpu", {}, per_tensor=per_tensor, per_member=per_member)
    assert cal.Calibration.from_json(calibration.to_json()) == calibration
    assert calibration.tensor_s(INT8, members=4) == pytest.approx(3e-4 + 3 * 5e-5)
    assert calibration.tensor_s(NONE, members=4) == pytest.approx(4e-4)   # no per_member: per_tensor
    assert calibration.tensor_s(FP16) == 0.0
    profile, bare = from_sizes([100] * 4, compute_s=0.0), cal.Calibration("box", "cpu", {})
    for front_end in ("horovod", "ddp"):
        step = _one_step(INT8, profile, calibration, front_end) - _one_step(INT8, profile, bare, front_end)
        assert step == pytest.approx(4 * 3e-4), front_end
    bucket = fused(profile, 1 << 20)
    assert [t.members for t in bucket.tensors] == [4]
    step = _one_step(INT8, bucket, calibration, "horovod") - _one_step(INT8, bucket, bare, "horovod")
    assert step == pytest.approx(3e-4 + 3 * 5e-5)
    assert _one_step(NONE, profile, calibration, "horovod") - _one_step(NONE, profile, bare, "horovod") \
        == pytest.approx(4 * 1e-4)
    assert _one_step(NONE, profile, calibration, "ddp") == _one_step(NONE, profile, bare, "ddp")


def test_compressed_allreduce_is_two_rounds_with_the_engines_bytes():
    ranks, b = 8, 8e6
    scatter, gather = coll.compressed_allreduce(b, ranks, LINK)
    assert scatter.total_s == pytest.approx(7 * 1e-5 + 7 / 8 * b / 1e9)   # all-to-all of B/P parts
    assert gather.total_s == pytest.approx(7 * 1e-5 + 7 * (b / 8) / 1e9)  # allgather of B/P
    assert scatter.wire_bytes + gather.wire_bytes == pytest.approx(wire_bytes("alltoall", b, ranks))


def test_the_cpu_part_of_a_link_stretches_with_the_share():
    link = Link(1e-5, 1e9, cpu_s_per_byte=4e-10)
    assert link.shared(1.0) == link and Link(1e-5, 1e9).shared(3.0) == Link(1e-5, 1e9)
    shared = link.shared(3.0)   # 1 ns per byte, 0.4 of it CPU: 1 + 2 · 0.4 = 1.8 ns
    assert 1 / shared.beta_bytes_per_s == pytest.approx(1.8e-9) and shared.alpha_s == link.alpha_s
    cluster = Cluster(4, 1, intra=link, inter=link, cpu_share=3.0)
    dense = exchange({"compressor": "none"}, (1000,), "allgather", "flat", cluster, FP16)
    assert dense.rounds[0][1].transfer_s == pytest.approx(2 * 3 / 4 * 4000 * 1.8e-9)


def test_one_rank_costs_nothing_and_flows_scale_the_transfer():
    assert coll.allreduce(1e6, 1, LINK).total_s == 0.0
    assert coll.allgather(1e6, 4, LINK, flows=3).transfer_s == pytest.approx(3 * 3e6 / 1e9)
    # 2 nodes of 4: each rank sends 4/8 of its bytes off-node, 4 ranks share the NIC
    assert coll.alltoall_flows(8, 4) == pytest.approx(4 * 4 / 7)


def test_flat_exchange_matches_the_hand_formula():
    cluster = Cluster(2, 4, intra=Link(1e-6, 1e11), inter=LINK)
    dense = exchange({"compressor": "none"}, (1000, 100), "allgather", "flat", cluster, FP16)
    b = 4 * 100_000
    assert dense.collective == "allreduce"
    assert dense.rounds[0][1].total_s == pytest.approx(14 * 1e-5 + 14 / 8 * b / 1e9)
    onebit = exchange({"compressor": "onebit"}, (1000, 100), "alltoall", "flat", cluster, FP16)
    seg = measure({"compressor": "onebit"}, (12500,)).total   # ⌈100000 / 8⌉ elements
    assert seg == math.ceil(12500 / 8) + 4                    # sign bits + one fp32 scale
    scatter = 7 * 1e-5 + (4 * 4 / 8) * 8 * seg / 1e9          # NIC bytes L(P-L)/P · B
    gather = 7 * 1e-5 + 7 * seg / 1e9
    assert [c.total_s for _, c in onebit.rounds] == pytest.approx([scatter, gather])


def test_two_level_exchange_matches_the_hand_formula():
    intra, nodes, local = Link(1e-6, 1e11), 3, 4
    cluster = Cluster(nodes, local, intra=intra, inter=LINK)
    plan = exchange({"compressor": "topk", "k": "0.01"}, (4000, 10), "allgather", "two-level", cluster, FP16)
    node_seg = 2 * 10_000                                  # fp16 of a 40000/4 segment
    shard = 8 * 100                                        # top-1% of a (1000, 10) shard: values + indices
    expected = [3 * 1e-6 + 3 / 4 * 4 * node_seg / 1e11,    # node all-to-all
                2 * 1e-5 + local * 2 * shard / 1e9,        # cross allgather, 4 flows on the NIC
                3 * 1e-6 + 3 * node_seg / 1e11]            # node allgather
    assert [c.total_s for _, c in plan.rounds] == pytest.approx(expected)
    assert plan.wire_bytes == 2 * shard and plan.node_bytes == pytest.approx(3 / 4 * 4 * node_seg + 3 * node_seg)


def test_multi_round_compressors_sum_their_rounds():
    cluster = Cluster(4, 1, intra=LINK, inter=LINK)
    plan = exchange({"compressor": "powersgd", "rank": "2"}, (300, 200), "allgather", "flat", cluster, FP16)
    assert [c.wire_bytes for _, c in plan.rounds] == [wire_bytes("allreduce", 4 * 300 * 2, 4),
                                                      wire_bytes("allreduce", 4 * 200 * 2, 4)]
    assert exchange({"compressor": "dgc"}, (300, 200), "alltoall", "flat", cluster, FP16) is None


# ---- units ---------------------------------------------------------------------------------------
def test_units():
    assert parse_bandwidth("--inter", "25gbit") == pytest.approx(25e9 / 8)
    assert parse_bandwidth("--inter", "100Mbit/s") == pytest.approx(12.5e6)
    assert parse_bandwidth("--intra", "300gbyte") == pytest.approx(3e11)
    assert parse_latency("--latency", "10us") == pytest.approx(1e-5)
    assert parse_latency("--latency", "5ms") == pytest.approx(5e-3)


@pytest.mark.parametrize("parse,value,words", [
    (parse_bandwidth, "25gb", ["--x='25gb'", "gbit", "gbyte"]),
    (parse_bandwidth, "fast", ["--x='fast'", "bandwidth"]),
    (parse_bandwidth, "0gbit", ["--x='0gbit'", "not positive"]),
    (parse_latency, "10", ["--x='10'", "us", "ms"]),
])
def test_unit_errors_name_the_parameter_value_and_allowed(parse, value, words):
    with pytest.raises(ValueError) as error:
        parse("--x", value)
    assert all(w in str(error.value) for w in words)


# ---- pipeline --------------------------------------------------------------------------------------
def _job(name, ready, latency, transfer, nbytes=1, later=()):
    return Job(name, ready, (("k", coll.Cost(latency, transfer)), *later), nbytes)


def test_pipeline_by_hand():
    # no cycle: a ready at 1 sends 1..3; b ready at 2 waits for a and sends 3..4; the backward
    # ends at 3.5, so synchronize waits for 4, then b's second round (1) and the optimizer (0.5)
    jobs = [_job("a", 1.0, 0.0, 2.0), _job("b", 2.0, 0.0, 1.0, later=(("k2", coll.Cost(0.5, 0.5)),))]
    timeline = simulate(jobs, backward_s=3.5, optimizer_s=0.5, fusion=Fusion(0, 0.0))
    assert timeline == (3.5, 4.0, 5.5)
    # compression in the hook (0.25 each) delays everything after it
    hooked = [j._replace(hook_s=0.25) for j in jobs]
    assert simulate(hooked, 3.5, 0.5, Fusion(0, 0.0)) == (4.0, 4.25, 5.75)


def test_fusion_pays_latency_once_per_buffer():
    jobs = [_job(n, 0.0, 1.0, 0.1, nbytes=40) for n in "abc"]
    assert fused_time(jobs, 0, threshold=100) == pytest.approx(1.0 + 0.1 + 1.0 + 0.2)   # [a, b] [c]... in order
    assert fused_time(jobs, 0, threshold=0) == pytest.approx(3 * 1.1)
    # a cycle of 1: a and b ready by t=1 fuse; c (ready at 1.5) goes at the tick at 2 (a+b end at 2.2)
    staged = [_job("a", 0.2, 1.0, 0.1), _job("b", 0.7, 1.0, 0.1), _job("c", 1.5, 1.0, 0.1)]
    timeline = simulate(staged, backward_s=1.5, optimizer_s=0.0, fusion=Fusion(100, 1.0))
    assert timeline.first_round_end_s == pytest.approx(1.0 + 1.2 + 1.1)


def test_from_sizes_ready_times():
    profile = from_sizes([100, [10, 30]], compute_s=3.0)   # forward 1 s, backward 2 s
    assert [(t.name, t.ready_s) for t in profile.tensors] == [("t1", pytest.approx(1 + 2 * 300 / 400)),
                                                              ("t0", pytest.approx(3.0))]
    with pytest.raises(ValueError, match="sizes"):
        from_sizes([[3, 0]])


# ---- calibration -------------------------------------------------------------------------------------
def test_fit_line_keeps_the_fixed_cost_and_the_big_tensors_slope():
    """100 us per call + 1 ns per element in cache, 1.3 ns past it (the 16M point, as memory-
    bound codecs run): the fixed cost stays within 10%, where an unweighted fit reads it
    negative (clipped to 0, every small tensor then free), and the slope is the big tensors'
    (between the two largest sizes), where a fit in relative error takes the cache's."""
    sizes = [64 * 64, 256 * 256, 1024 * 1024, 16 * 1024 * 1024]
    seconds = [1e-4 + 1e-9 * n for n in sizes[:3]] + [1e-4 + 1.3e-9 * sizes[3]]
    assert np.polyfit(sizes, seconds, 1)[1] < 0
    fit = cal.fit_line(sizes, seconds)
    assert abs(fit.a - 1e-4) < 1e-5
    assert fit.b == pytest.approx((seconds[3] - seconds[2]) / (sizes[3] - sizes[2]))
    assert fit.at(sizes[3]) == pytest.approx(seconds[3], rel=0.02)
    with pytest.raises(ValueError, match="two sizes"):
        cal.fit_line([10], [1.0])


def test_fit_line_recovers_a_line():
    fit = cal.fit_line([1, 2, 4], [3 + 2 * n for n in (1, 2, 4)])
    assert fit == pytest.approx((3.0, 2.0))
    times = cal.CodecTimes(cal.Fit(0, 1), cal.Fit(1, 0), cal.Fit(4, 0))
    assert times.decode_s(10, payloads=1) == 1 and times.decode_s(10, payloads=7) == pytest.approx(1 + 3 * 2)


def test_calibration_cache_round_trip(tmp_path):
    specs = [FP16, {"compressor": "onebit", "ef": "vanilla"}]
    measured = cal.calibrate(specs, sizes=(256, 1024, 4096), repeats=1, device="cpu")
    path = cal.save(measured, cal.cache_path("cpu", tmp_path, host="box"))
    assert path.name == "calibration-box-cpu.json"
    loaded = cal.load(path)
    assert loaded == measured and loaded.times(FP16) is not None
    assert loaded.times({"compressor": "int8"}) is None
    assert cal.load(tmp_path / "missing.json") is None


# ---- model and command line --------------------------------------------------------------------------
def _cluster(nodes=4):
    return Cluster(nodes, 8, intra=Link(2e-6, 3e11), inter=Link(1e-5, 25e9 / 8))


def test_predict_is_deterministic_and_compression_wins_on_a_slow_network():
    profile = from_sizes([[1024, 1024]] * 4 + [1024] * 4, compute_s=0.01)
    first, second = predict(profile, _cluster()), predict(profile, _cluster())
    assert first == second and recommend(first) == recommend(list(reversed(second)))
    by = {(r.compressor, r.collective, r.level): r for r in first}
    assert by["none", "allreduce", "flat"].speedup_vs_dense == pytest.approx(1.0)
    assert by["fp16", "allreduce", "flat"].speedup_vs_fp16 == pytest.approx(1.0)
    best = recommend(first)   # the network hides behind the 10 ms of compute
    assert best.speedup_vs_fp16 > 1.25 and best.step_time_s < 1.05 * profile.compute_s
    # the allgather grows with P: int8 (r = 1/4) loses to dense at 32 ranks
    assert by["int8", "allgather", "flat"].speedup_vs_dense < 1.0


def test_cli_on_a_sizes_file(tmp_path):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps([[256, 256], 256, [64, 3, 3, 3]]))
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "hvdcompress.plan", "--sizes", str(sizes), "--nodes", "2",
           "--inter", "10gbit", "--compressors", "none", "fp16", "compressor=topk,k=0.01",
           "--cache-dir", str(tmp_path), "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "recommended:" in run.stdout and "codec time not modelled" in run.stdout
    rows = json.loads(out.read_text())
    assert {r["compressor"] for r in rows} == {"none", "fp16", "compressor=topk,k=0.01"}
    bad = subprocess.run(cmd[:-2] + ["--latency", "10"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--latency='10'" in bad.stderr


# ---- fusion= in the model (hvdcompress.engines.fusion) -----------------------------------------------------
def test_a_fused_profile_exchanges_buckets_ready_with_their_last_member():
    from hvdcompress.plan.profile import fused

    # forward order t0 (1000), t1 (10), t2 (10), t3 (2000): the backward readies t3 first, t0 last
    profile = from_sizes([1000, 10, 10, 2000], compute_s=0.3)
    ready = {t.name: t.ready_s for t in profile.tensors}
    bucketed = fused(profile, threshold_bytes=4 * 1020)
    # name order t0, t1, t2, t3: t0..t2 fit in 4080 bytes, t3 (8000 bytes) stays alone
    assert [(t.name, t.numel) for t in bucketed.tensors] == [("t3", 2000), ("fused[t0..t2]", 1020)]
    assert bucketed.tensors[1].ready_s == max(ready["t0"], ready["t1"], ready["t2"]) == ready["t0"]
    assert (bucketed.backward_s, bucketed.numel) == (profile.backward_s, profile.numel)


def test_the_cli_predicts_fused_compressors_on_buckets_and_powersgd_per_tensor(tmp_path):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps([[384, 384], 384, 384] * 8))
    out = tmp_path / "rows.json"
    args = ["--sizes", str(sizes), "--nodes", "2", "--gpus-per-node", "1", "--inter", "1gbit",
            "--no-codec", "--levels", "flat", "--collectives", "allgather", "--json", str(out),
            "--compressors", "none", "compressor=onebit,ef=vanilla", "compressor=powersgd,rank=2"]
    plain = {(r["compressor"]): r for r in _cli(args)}
    fused_rows = {(r["compressor"]): r for r in _cli(args + ["--fused", str(1 << 20)])}
    # 24 tensors -> one collective per bucket: less latency for onebit; PowerSGD unchanged
    assert fused_rows["compressor=onebit,ef=vanilla"]["step_time_s"] < plain["compressor=onebit,ef=vanilla"]["step_time_s"]
    assert fused_rows["compressor=powersgd,rank=2"]["step_time_s"] == plain["compressor=powersgd,rank=2"]["step_time_s"]
    assert fused_rows["none"]["speedup_vs_dense"] <= 1.0   # dense against Horovod's own dense


def _cli(args: list) -> list:
    from hvdcompress.plan.__main__ import main

    out = Path(args[args.index("--json") + 1])
    assert main(args) == 0
    return json.loads(out.read_text())


def test_the_cli_front_end_and_calibrate_job_errors(tmp_path, capsys):
    """--front-end ddp adds DDP's gradient copies from the cached calibration (dense: 2 passes);
    --calibrate-job without a calibration to add to says to calibrate first (exit 2)."""
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps([[512, 512]]))
    calibration = cal.Calibration("box", "cpu", {}, copy_s_per_byte=1e-9, per_tensor={cal.spec_key(INT8): 1e-3})
    cal.save(calibration, cal.cache_path("cpu", tmp_path))
    out = tmp_path / "rows.json"
    args = ["--sizes", str(sizes), "--nodes", "2", "--gpus-per-node", "1", "--inter", "1gbit", "--device", "cpu",
            "--cache-dir", str(tmp_path), "--levels", "flat", "--cycle-ms", "0", "--compressors", "none", "int8",
            "--json", str(out)]   # no cycle: the copies add up exactly
    horovod = {r["compressor"]: r["step_time_s"] for r in _cli(args)}
    ddp = {r["compressor"]: r["step_time_s"] for r in _cli(args + ["--front-end", "ddp"])}
    assert ddp["none"] - horovod["none"] == pytest.approx(2 * 4 * 512 * 512 * 1e-9)
    assert ddp["int8"] > horovod["int8"]
    from hvdcompress.plan.__main__ import main
    with pytest.raises(SystemExit) as exit_:
        main(["--calibrate-job", "--device", "cpu", "--cache-dir", str(tmp_path / "empty")])
    assert exit_.value.code == 2 and "run with --calibrate first" in capsys.readouterr().err
