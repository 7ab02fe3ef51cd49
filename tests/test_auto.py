"""compression="auto" (hvdcompress.auto): the per-tensor pick on synthetic links against hand
computations, the re-plan rule, the errors of its arguments, and the engine running it on
simulated ranks (same plan everywhere, state under the compressor's label, the re-plan check)."""
import math
from dataclasses import replace

import pytest
import torch
from simulator import run_ranks

import hvdcompress
from hvdcompress.auto import SAFE, Auto, choose, from_arguments
from hvdcompress.auto import compressor as auto_compressor
from hvdcompress.auto.choice import CHOICES, flat_cluster, parse_allowed, parse_link
from hvdcompress.auto.compressor import CODEC_BOUND, replan_inputs
from hvdcompress.auto.probe import measure_link
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.engines.exchange import Exchange
from hvdcompress.ops.torch_ops import TorchOps
from hvdcompress.plan import Calibration, CodecTimes, Fit, Link
from hvdcompress.plan.payloads import DEFAULT_COMPRESSORS, spec_key
from hvdcompress.step.options import parse_options

SPECS = {label: CHOICES[label] for label in SAFE}
BIG, TINY = (1024, 1024), (10,)
ALPHA = 50e-6


def slow_codecs() -> Calibration:
    """fp16 and bf16 at 20 us + 0.5 ns per element each way; int8 at 20 us + 4 ns to compress,
    2 ns to decode one payload, 8 ns for four; none free (not calibrated)."""
    cast = CodecTimes(Fit(20e-6, 0.5e-9), Fit(20e-6, 0.5e-9), Fit(20e-6, 0.5e-9))
    int8 = CodecTimes(Fit(20e-6, 4e-9), Fit(20e-6, 2e-9), Fit(20e-6, 8e-9))
    return Calibration("test", "cpu", {spec_key(CHOICES["fp16"]): cast, spec_key(CHOICES["bf16"]): cast,
                                       spec_key(CHOICES["int8"]): int8})


def cluster(bandwidth_bytes: float, ranks: int = 4):
    return flat_cluster(ranks, Link(ALPHA, bandwidth_bytes))


# ---- the pick ----------------------------------------------------------------------------------
def test_fast_link_and_slow_codecs_pick_none_and_fp16():
    """10 Gbit/s, P = 4: a tensor adds the ring allreduce's transfer 1.5 B / beta to a fused
    step (the latency is the fused collective's). Big tensor (n = 2^20): none 1.5 * 4n / 1.25e9
    = 5.03 ms; fp16 1.5 * 2n / 1.25e9 + 2 * (20 us + 0.5 ns * n) = 3.61 ms; int8 pays 4 ns * n =
    4.2 ms to compress alone. Tiny (n = 10): fp16's and bf16's 40 us of codec lose."""
    beta, n = 1.25e9, BIG[0] * BIG[1]
    big = choose(BIG, cluster(beta), SPECS, slow_codecs())
    assert (big.label, big.collective) == ("fp16", "allreduce")
    assert big.seconds == pytest.approx(1.5 * 2 * n / beta + 2 * (20e-6 + 0.5e-9 * n))
    tiny = choose(TINY, cluster(beta), SPECS, slow_codecs())
    assert (tiny.label, tiny.collective) == ("none", "allreduce")
    assert tiny.seconds == pytest.approx(1.5 * 40 / beta)


def test_slow_link_picks_int8_alltoall_for_big_tensors_and_none_for_tiny_ones():
    """100 Mbit/s, P = 4: fp16 sends 1.5 * 2n / 12.5e6 = 252 ms for the big tensor; int8's
    compressed allreduce sends about 1.5 n bytes (scatter 3/4, gather 3 x 1/4 of n, plus
    scales): ~126 ms, plus ~8 ms of codec; its allgather sends 3 n: ~252 ms. Tiny: none."""
    beta, n = 12.5e6, BIG[0] * BIG[1]
    big = choose(BIG, cluster(beta), SPECS, slow_codecs())
    assert (big.label, big.collective) == ("int8", "alltoall")
    fp16 = 1.5 * 2 * n / beta + 2 * (20e-6 + 0.5e-9 * n)
    assert 1.5 * n / beta < big.seconds < 0.6 * fp16
    tiny = choose(TINY, cluster(beta), SPECS, slow_codecs())
    assert (tiny.label, tiny.collective) == ("none", "allreduce")


def test_allowed_order_breaks_ties_and_one_rank_sends_nothing():
    one = choose(BIG, cluster(1e9, ranks=1), SPECS, None)
    assert (one.label, one.seconds, one.wire_bytes) == ("none", 0.0, 0.0)
    fp16_first = choose(BIG, cluster(1e9, ranks=1), {k: SPECS[k] for k in ("fp16", "none")}, None)
    assert fp16_first.label == "fp16"


def test_aggressive_compressors_only_when_listed():
    beta = 12.5e6
    safe = choose(BIG, cluster(beta), SPECS, None)
    listed = choose(BIG, cluster(beta), parse_allowed(["none", "fp16", "int8", "onebit+ef"]), None)
    assert safe.label == "int8" and listed.label == "onebit+ef"
    assert listed.seconds < safe.seconds


# ---- the re-plan rule --------------------------------------------------------------------------
def test_replan_rule_by_hand():
    link = Link(1e-4, 1e8)
    # S = 1.0, E = 0.2, P = 0.25 (N = 0.2, K = 0.05): C = 0.8, |E - P| / (C + P) = 0.05 / 1.05
    verdict = replan_inputs(link, 1.0, 0.2, 0.05, 0.25, 0.2)
    assert verdict.error == pytest.approx(0.05 / 1.05) and verdict.link is None
    # E = 0.6 with K' = 0.15 measured in the codecs: error 0.35 / 1.05 > 25%; codecs
    # k = 0.15 / 0.05 = 3, link f = (0.6 - 0.15) / 0.2 = 2.25
    verdict = replan_inputs(link, 1.4, 0.6, 0.15, 0.25, 0.2)
    assert verdict.error == pytest.approx(0.35 / 1.05)
    assert verdict.codec_factor == pytest.approx(3.0)
    assert verdict.link == Link(pytest.approx(2.25e-4), pytest.approx(1e8 / 2.25))
    # codec time left out of the prediction (K = 0): the codecs keep their times, the link
    # takes what the engine waited beyond them: f = (0.6 - 0.15) / 0.25
    verdict = replan_inputs(link, 1.4, 0.6, 0.15, 0.25, 0.25)
    assert verdict.codec_factor == 1.0 and verdict.link.alpha_s == pytest.approx(1.8e-4)
    # the codec factor is bounded (a codec predicted at 5% of P that took the whole exchange)
    assert replan_inputs(link, 20.0, 19.0, 19.0, 0.2, 0.19).codec_factor == CODEC_BOUND
    # nothing on the network (one rank): never re-plans
    assert replan_inputs(link, 1.0, 0.9, 0.0, 0.1, 0.0).link is None
    # a scaled link keeps its transport's half-duplex pairs
    assert replan_inputs(replace(link, half_duplex_pairs=True), 1.4, 0.6, 0.15, 0.25, 0.2).link.half_duplex_pairs


def test_a_calibration_scales_its_codec_times_not_its_sums():
    fit = CodecTimes(Fit(1e-5, 2e-9), Fit(3e-5, 4e-9), Fit(5e-5, 6e-9))
    base = Calibration("h", "cpu", {"k": fit}, {"float32": 1e-10})
    scaled = base.scaled(3.0)
    assert scaled.codecs["k"].compress_s(1000) == pytest.approx(3 * fit.compress_s(1000))
    assert scaled.codecs["k"].decode_s(1000, 4) == pytest.approx(3 * fit.decode_s(1000, 4))
    assert scaled.reduce == base.reduce and base.codecs["k"] == fit


def test_the_measured_link_takes_the_transports_half_duplex_pairs():
    """measure_link asks the collectives whether pairs take turns for tensors where the
    gradients live (Gloo's CPU pairs do); the simulated ranks' default does not."""
    def measure(comm, turns):
        if turns:
            comm.pairs_take_turns = lambda on_gpu: not on_gpu
        return measure_link(comm, TorchOps(), torch.zeros(1))
    assert all(link.half_duplex_pairs for link in run_ranks(2, lambda comm: measure(comm, True)))
    assert not any(link.half_duplex_pairs for link in run_ranks(2, lambda comm: measure(comm, False)))


# ---- arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value, words", [
    (["none", "zstd"], ["auto_allowed=", "'zstd' is unknown", "allowed: labels", "onebit+ef"]),
    (["none", "dgc 0.999"], ["auto_allowed=", "'dgc 0.999'", "momentum", "allowed:"]),
    ([{"compressor": "topk", "k": "lots"}], ["auto_allowed=", "cannot be built", "allowed:"]),
    ([], ["auto_allowed=[]", "non-empty", "allowed:"]),
    ("none,none", ["auto_allowed='none,none'", "listed twice"]),
    ({"compressor": "fp16"}, ["auto_allowed=", "non-empty list", "allowed:"]),
])
def test_bad_auto_allowed_names_the_parameter_the_value_and_what_is_allowed(value, words):
    with pytest.raises(ValueError) as error:
        from_arguments("auto", auto_allowed=value)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("value, words", [
    ({"bandwidth": "10 furlongs", "latency": "50us"}, ["link['bandwidth']", "furlongs", "allowed:", "gbit"]),
    ({"bandwidth": "10gbit"}, ["link=", "not a link", "allowed:", "latency"]),
    ({"bandwidth": "10gbit", "latency": -1}, ["link['latency']=-1", "not positive", "allowed:"]),
    ("fast", ["link='fast'", "not a link", "allowed:"]),
    (Link(1e-5, 0.0), ["link=", "beta_bytes_per_s > 0"]),
])
def test_bad_link_names_the_parameter_the_value_and_what_is_allowed(value, words):
    with pytest.raises(ValueError) as error:
        from_arguments("auto", link=value)
    for word in words:
        assert word in str(error.value)


def test_link_forms_agree():
    want = Link(pytest.approx(50e-6), pytest.approx(10e9 / 8))
    assert parse_link({"bandwidth": "10gbit", "latency": "50us"}) == want
    assert parse_link("10gbit,50us") == want
    assert parse_link({"bandwidth": 1.25e9, "latency": 5e-5}) == want
    link = Link(1e-6, 1e9)
    assert parse_link(link) is link and parse_link(None) is None


def test_options_and_from_params_build_auto_and_refuse_what_does_not_combine():
    options = parse_options("auto", op=1, average_op=1, sum_op=2, auto_allowed="none,fp16", link="1gbit,20us")
    assert isinstance(options.compressor, Auto)
    assert options.compressor.allowed == ("none", "fp16")
    assert options.compressor.link == Link(pytest.approx(20e-6), pytest.approx(1.25e8))
    built = hvdcompress.from_params({"compressor": "auto", "allowed": "none,fp16", "link": "1gbit,20us"})
    assert repr(built) == repr(Auto(allowed=["none", "fp16"], link="1gbit,20us"))
    assert "auto" not in hvdcompress.available()   # a planner over the algorithms, not one
    with pytest.raises(ValueError, match=r"auto_allowed=\['fp16'\] without compression='auto'"):
        parse_options(hvdcompress.FP16(), op=1, average_op=1, sum_op=2, auto_allowed=["fp16"])
    with pytest.raises(ValueError, match="collective='alltoall'.*allowed: collective='auto'"):
        parse_options("auto", op=1, average_op=1, sum_op=2, collective="alltoall")
    with pytest.raises(ValueError, match="ef='vanilla' with compressor='auto'"):
        hvdcompress.from_params({"compressor": "auto", "ef": "vanilla"})
    with pytest.raises(ValueError, match="calibration='fast'.*allowed: 'machine'"):
        Auto(calibration="fast")


def test_a_wrapped_auto_fails_clearly():
    """Auto must be the compression itself: wrapped, the engine never asks it for a plan."""
    auto = Auto(allowed="none", link="1gbit,20us", calibration=None)
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="Auto must be the compression itself"):
        auto.compress(TorchOps(), x, {}, TensorInfo(name="w", numel=4))


# ---- the engine on simulated ranks -------------------------------------------------------------
SHAPES = {"layer.bias": TINY, "layer.weight": (256, 256)}
ALLOWED = ["none", "fp16", "int8", "onebit+ef"]
MIXED = {"layer.bias": ("none", "allreduce"), "layer.weight": ("int8", "alltoall")}


def _grads(step: int, world: int, shape: tuple) -> list:
    return [torch.randn(shape, generator=torch.Generator().manual_seed(100 * step + r)).view(-1)
            for r in range(world)]


def _step(engine, states: dict, step: int, names) -> dict:
    """One exchange of ``names``' seeded gradients on ``engine``; their totals."""
    comm = engine.comm
    entries = []
    for name in names:
        shape = SHAPES[name]
        info = TensorInfo(name=name, numel=math.prod(shape), world=comm.world, shape=shape, rank=comm.rank)
        entries.append(engine.compress(name, _grads(step, comm.world, shape)[comm.rank], states[name], info))
    totals = {e.key: e.total for e in engine.finish(engine.start(entries))}
    engine.end_step()
    return totals


def _against_references(comm, steps: int, allowed: list):
    """Auto's totals and, for each tensor, those of a plain engine running the compressor and
    collective Auto picked (its own state): they must be the same bits."""
    auto = Auto(allowed=allowed, link="100mbit,50us", calibration=slow_codecs(), replan=False)
    engine = Exchange(auto, TorchOps(), comm)
    states = {name: {} for name in SHAPES}
    got = [_step(engine, states, 0, sorted(SHAPES))]
    references = {name: Exchange(hvdcompress.from_params(CHOICES[label]), TorchOps(), comm,
                                 collective="auto" if collective == "allreduce" else collective)
                  for name, (label, collective) in auto.plan.items()}
    own = {name: {} for name in SHAPES}
    want = [{name: _step(references[name], own, 0, [name])[name] for name in sorted(SHAPES)}]
    for step in range(1, steps):
        got.append(_step(engine, states, step, sorted(SHAPES)))
        want.append({name: _step(references[name], own, step, [name])[name] for name in sorted(SHAPES)})
    return auto.plan, {name: sorted(state) for name, state in states.items()}, got, want


@pytest.mark.parametrize("allowed, picks", [(list(SAFE), MIXED), (["onebit+ef"], None)])
def test_auto_runs_each_tensor_as_its_pick_would_alone(allowed, picks):
    """SAFE at 100 Mbit/s on 3 ranks with the slow codecs: the weight (65536 elements) takes
    int8's compressed allreduce, the bias none (int8's 20 us codec against 4 us of transfer)."""
    results = run_ranks(3, lambda comm: _against_references(comm, 3, allowed))
    plan, keys, got, want = results[0]
    expected = {name: choose(shape, flat_cluster(3, Link(ALPHA, 12.5e6)), parse_allowed(allowed), slow_codecs())
                for name, shape in SHAPES.items()}
    assert plan == {name: (c.label, c.collective) for name, c in sorted(expected.items())}
    assert picks is None or plan == picks
    for rank, (other_plan, other_keys, other_got, other_want) in enumerate(results):
        assert (other_plan, other_keys) == (plan, keys), rank
        for step_got, step_want in zip(other_got, other_want):
            for name in SHAPES:
                assert torch.equal(step_got[name], step_want[name]), (rank, name)
    for name, (label, collective) in plan.items():   # each pick's state under its label
        if label == "onebit+ef":
            assert keys[name] == (["onebit+ef/residual"] if collective == "allgather" else
                                  [f"seg{j}.onebit+ef/residual" for j in range(3)] + ["sum.onebit+ef/residual"])


def _check(comm, steps: int):
    auto = Auto(allowed=ALLOWED, link="100mbit,50us", calibration=slow_codecs())
    engine = Exchange(auto, TorchOps(), comm)
    states = {name: {} for name in SHAPES}
    for step in range(steps):
        _step(engine, states, step, sorted(SHAPES))
    # the codecs' clock runs inside the engine's (each rank's own seconds: compared here)
    return auto.plan, auto.checks, auto.network, 0 < auto.codec_s < engine.busy_s


def test_the_check_runs_once_and_every_rank_decides_alike(monkeypatch):
    """Timing is not asserted: only that the check ran once, on the means over ranks, and that
    every rank took the same decision (and the same re-scaled link when it re-planned)."""
    monkeypatch.setattr(auto_compressor, "WARMUP_STEPS", 1)
    monkeypatch.setattr(auto_compressor, "CHECK_STEPS", 2)
    results = run_ranks(3, lambda comm: _check(comm, 7))   # check at 3, two trials of 2 steps
    plan, checks, network, clocked = results[0]
    assert len(checks) == 1 and all(r == results[0] for r in results) and clocked
    assert checks[0]["codec_s"] > 0 and checks[0]["codec_factor"] > 0
    given = parse_link("100mbit,50us")
    assert (network == given) == (checks[0]["kept"] != "replanned")
    timed = checks[0]["trials"]   # the re-planned plan after a failed check; none where it differs
    assert [t["plan"] for t in timed] in (["replanned", "none"], ["replanned"], ["none"], [])
    assert checks[0]["replanned"] or "replanned" not in [t["plan"] for t in timed]
    if timed:   # the plan kept is the fastest timed (the model's on a tie)
        fastest = min([("model", checks[0]["step_s"])] + [(t["plan"], t["step_s"]) for t in timed],
                      key=lambda t: t[1])[0]
        assert checks[0]["kept"] == fastest


def test_state_dict_round_trip_keeps_each_compressors_counters():
    auto = Auto(allowed=["none", "topk 1%"], link="1gbit,20us", calibration=None)
    assert auto.keeps_residual   # topk 1% carries error feedback: clip_grad_norm clips before
    auto.load_state_dict(auto.state_dict())
    assert all("/" in key for key in auto.state_dict())


# ---- real ranks --------------------------------------------------------------------------------
def _launch(script: str, home, cases: tuple, keep: tuple) -> dict:
    """Rank 0's record of each case of a 2-rank launch (HOME: a fresh directory, so this machine
    is calibrated then, and cached), after checking that both ranks reported ``keep`` alike and
    that the re-plan check ran once; every record under ``"records"``."""
    from conftest import run_horovod

    records = run_horovod(script, np=2, env={"HOME": str(home)}, timeout=600)
    out = {"records": records}
    for case in cases:
        ranks = [r for r in records if r["case"] == case]
        assert len(ranks) == 2, case
        assert {k: ranks[0][k] for k in keep} == {k: ranks[1][k] for k in keep}, case
        assert len(ranks[0]["checks"]) == 1 and len(ranks[0]["plan"]) == 4, case
        out[case] = ranks[0]
    assert list((home / ".cache" / "hvdcompress").glob("calibration-*.json"))
    return out


def _given_link_plan(shapes: dict) -> dict:
    """The plan of tests/hvd/*_auto.py's given link (100 Mbit/s, 50 us, no codec time), at 2 ranks
    over Gloo, whose pairs take turns (the transport's, whatever the link given says)."""
    link = replace(parse_link("100mbit,50us"), half_duplex_pairs=True)
    return {name.split(":")[0]: list(choose(tuple(shape), flat_cluster(2, link), SPECS, None)[:2])
            for name, shape in sorted(shapes.items())}


@pytest.mark.horovod
def test_horovod_ranks_pick_the_same_plan_and_stay_identical(tmp_path):
    """One launch of 2 ranks (tests/hvd/torch_auto.py): with the link given and codec time left
    out, the first plan is the one recomputed here from the shapes; with the link measured and
    this machine calibrated, every rank holds rank 0's link and the same plan. check_replicas=1
    compares the parameters at every step, and the ranks end with the same parameters."""
    got = _launch("torch_auto.py", tmp_path, ("given", "measured"),
                  ("first", "plan", "checks", "link", "predicted", "params"))
    assert got["given"]["first"] == _given_link_plan(got["given"]["shapes"])
    # P = 2 over Gloo: int8's allgather sends a quarter of the float32 bytes, but its pairs take
    # turns (x2); fp16's ring allreduce sends half of them both ways at once: fp16 by int8's scales
    assert got["given"]["first"]["0.weight"] == ["fp16", "allreduce"]
    assert got["measured"]["link"][0] > 0 and got["measured"]["link"][1] > 0
    # Gloo's pairs take turns: measured or given, the link planned with says so
    assert got["measured"]["link"][2] is True and got["given"]["link"][2] is True
    # then python -m hvdcompress.plan --calibrate-job added the cost per tensor to the calibration
    # cached by the "measured" case: every compressor asked for (with the node compressor, fp16),
    # per member of a bucket only for what fuses (int8; none and fp16 are Horovod's own, PowerSGD
    # cannot), the codec times kept; both ranks read the same file
    costs = [r for r in got["records"] if r["case"] == "job_costs"]
    assert len(costs) == 2 and costs[0]["per_tensor"] == costs[1]["per_tensor"]
    keys = {spec_key(DEFAULT_COMPRESSORS[label]) for label in ("none", "fp16", "int8", "powersgd r4")}
    assert set(costs[0]["per_tensor"]) == keys and set(costs[0]["per_member"]) == {spec_key({"compressor": "int8"})}
    assert all(math.isfinite(v) and v >= 0 for v in [*costs[0]["per_tensor"].values(), *costs[0]["per_member"].values()])
    assert spec_key({"compressor": "int8"}) in costs[0]["codecs"]


@pytest.mark.horovod
def test_horovod_tensorflow_tape_and_keras_plan_alike(tmp_path):
    """One launch of 2 ranks (tests/hvd/tf_auto.py): the eager tape with the link given and no
    codec time picks what is recomputed here; Keras's fit plans inside its tf.function, with
    this machine calibrated. Every rank holds the same plan and weights."""
    got = _launch("tf_auto.py", tmp_path, ("tape", "keras"), ("first", "plan", "checks", "params"))
    assert got["tape"]["first"] == _given_link_plan(got["tape"]["shapes"])


def test_the_cost_per_tensor_weighs_in_the_pick():
    """100 Mbit/s, P = 4, the big tensor: int8's compressed allreduce (~134 ms) beats fp16
    (~252 ms) until the calibration says int8 costs the front end 0.2 s per tensor in a job
    (``--calibrate-job``); fp16 then wins (bf16, the same bytes and codec, 1 ms dearer per
    tensor), and its seconds hold its own cost per tensor."""
    beta = 12.5e6
    plain = slow_codecs()
    assert choose(BIG, cluster(beta), SPECS, plain).label == "int8"
    costly = replace(plain, per_tensor={spec_key(CHOICES["int8"]): 0.2, spec_key(CHOICES["fp16"]): 1e-3,
                                        spec_key(CHOICES["bf16"]): 2e-3})
    fp16 = choose(BIG, cluster(beta), SPECS, costly)
    assert fp16.label == "fp16"   # bf16 sends as many bytes at the same codec cost: 1 ms more per tensor
    bare = choose(BIG, cluster(beta), {"fp16": SPECS["fp16"]}, plain)
    assert fp16.seconds == pytest.approx(bare.seconds + 1e-3)
