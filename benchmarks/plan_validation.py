"""The cost model (:mod:`hvdcompress.plan`) against step times measured on the emulated network.

Measure first (root: network namespaces), every method of a setting in one launch::

    sudo .venv/bin/python benchmarks/e2e.py --models mlp --nps 2,4 --rates 100mbit,1gbit,10gbit \\
        --methods nocomm,hvd-dense,hvd-fp16,int8,onebit-ef,dgc,csc,powersgd,ddp-dense,ddp-fp16,\\
ddp-powersgd,ddp:powersgd,ddp:int8,ddp:onebit-ef,ddp:dgc \\
        --json benchmarks/results/e2e_validation.json

then predict and compare::

    .venv/bin/python benchmarks/plan_validation.py [--e2e benchmarks/results/e2e_validation.json]
    .venv/bin/python benchmarks/plan_validation.py --e2e benchmarks/results/e2e_fusion.json \
        --json benchmarks/results/plan_validation_deep.json      # 98 tensors, fused (M@fusion=B) or not

What the model is given, per setting (model, ranks or hosts x slots, rate): the model's tensor
shapes; the compute floor (``nocomm``: forward + backward, then the optimizer step; the
backward's share of it spread over the tensors as :func:`hvdcompress.plan.profile.from_sizes`
does) measured at the probe (below), where every rank has a core; this machine's calibration
at one thread per process, run by min(ranks, cores) processes at once as the ranks share the
memory (cached apart from the plan's own): codec times, the reduction's gamma per dtype and a
memory copy's cost (DDP's gradient copies, :mod:`hvdcompress.plan.front_ends`); the front ends'
cost per tensor and per fused-bucket member, measured in the probe's job
(:mod:`hvdcompress.torch.job_costs`, :func:`job_calibration`); for the Horovod front end, its float16 gamma solved from a 2-rank ``hvd.allreduce`` on
loopback, float32 against float16 (:func:`horovod_gamma`: Horovod's float16 sum converts in
software, about 11x numpy's float16 add here; torch's Gloo, the DDP hook's, sums at about
numpy's speed);
``cpu_share = ranks / cores`` (every emulated host is a namespace of this machine), which
stretches compute, codec, sums and the CPU's part of a byte's transfer (the fitted 1/beta less
the wire's seconds per byte at the emulated rate) when the ranks outnumber the cores; Horovod's fusion
defaults. The links are *fitted*, not assumed: per rate, alpha is :data:`ALPHA_S` and beta the
one with which the model predicts the dense step at the fewest ranks measured at that rate (the
probe) exactly; those probe rows are left out of the error statistics.
Reported, for the Horovod front end and the DDP hook (the same exchange engine, other
launch overheads) separately: per method the predicted and measured step and the relative
error; the median and worst absolute error; and per setting whether the fastest method is
predicted correctly.
Writes ``benchmarks/results/plan_validation.json``.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"   # calibrate as the ranks run (e2e: one thread each), before
HERE = Path(__file__).resolve().parent  # the kernels' OpenMP and torch read it
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))   # hvdrun
CACHE = Path.home() / ".cache" / "hvdcompress" / "one-thread"

from hvdrun import LaunchError, run_script, write_result  # noqa: E402

from hvdcompress import from_params  # noqa: E402
from hvdcompress.engines.fusion import check_fusion  # noqa: E402
from hvdcompress.plan import calibration as cal  # noqa: E402
from hvdcompress.plan.front_ends import FRONT_ENDS as GRADIENT_COPIES  # noqa: E402
from hvdcompress.plan.links import Cluster, Link, cpu_share  # noqa: E402
from hvdcompress.plan.model import predict  # noqa: E402
from hvdcompress.plan.payloads import DEFAULT_COMPRESSORS  # noqa: E402
from hvdcompress.plan.profile import from_sizes, fused  # noqa: E402
from hvdcompress.torch import job_costs

#: per front end, e2e method -> the plan's compressor label; the first is the probe (dense)
FRONT_ENDS = {
    "horovod": {"hvd-dense": "none", "hvd-fp16": "fp16", "int8": "int8", "onebit-ef": "onebit+ef",
                "onebit:ef=vanilla": "onebit+ef", "dgc": "dgc 0.999", "csc": "csc 1%", "powersgd": "powersgd r4",
                "topk-ef": "topk 1%", "topk:k=0.01:ef=vanilla": "topk 1%"},
    "ddp": {"ddp-dense": "none", "ddp-fp16": "fp16", "ddp:int8": "int8", "ddp:onebit-ef": "onebit+ef",
            "ddp:dgc": "dgc 0.999", "ddp:powersgd": "powersgd r4"},
}
#: the plan's label -> spec of every compressor validated (calibrated, and measured in the probe's job)
VALIDATED = {label: DEFAULT_COMPRESSORS[label] for methods in FRONT_ENDS.values() for label in methods.values()}
#: this machine's cores: with more ranks than cores the ranks time-slice, outside the model's
#: premise of a core (or a GPU) per rank; reported apart
CORES = os.cpu_count() or 1
ALPHA_S = 100e-6   # per message on the emulated links (veth + Gloo's TCP); the fit takes beta
LOOPBACK_ALPHA_S = 10e-6   # per message between ranks of one host (loopback)


def shapes(model: str) -> list:
    from e2e import build_model
    return [tuple(p.shape) for p in build_model(model).parameters()]


@functools.lru_cache(maxsize=None)
def calibration_for(ranks: int) -> cal.Calibration:
    """This machine's calibration (cached), by as many processes at once as the ranks that run
    at once (every rank on this machine, at most one per core)."""
    import torch
    torch.set_num_threads(1)
    specs = list(VALIDATED.values())
    processes = min(ranks, os.cpu_count() or 1)
    path = cal.cache_path("cpu", CACHE, processes=processes)
    base = cal.load(path)
    if base is None or not base.reduce or any(base.times(s) is None for s in specs):
        base = cal.calibrate(specs, device="cpu", processes=processes)
        cal.save(base, path)
    return base


#: the probe's launch: ranks, elements per tensor (a fusion buffer's worth, as the calibration),
#: timed runs after one warm-up, and its time-out; cached in :data:`PROBE_CACHE`
PROBE_RANKS, PROBE_REPEATS, PROBE_TIMEOUT_S = 2, 8, 300
PROBE_CACHE = CACHE / "horovod-allreduce-probe.json"


@functools.lru_cache(maxsize=None)
def horovod_gamma(ranks: int) -> cal.Calibration:
    """:func:`calibration_for` with the float16 gamma of Horovod's own allreduce (its float32
    gamma stays numpy's: the probe's premise).

    The probe (:func:`_probe_allreduce`, cached in :data:`PROBE_CACHE`, so the validation
    launches it once; its job then measures the costs per tensor, :func:`job_calibration`): ``hvd.allreduce`` with ``op=hvd.Sum`` (gamma is the sum's cost, and the
    engine's allreduces are sums) of N = 16M elements on P = 2 ranks over loopback
    (``horovodrun --gloo``), float32 (B32 = 4N bytes) then float16 (B16 = 2N), best of
    :data:`PROBE_REPEATS` after a warm-up. (``op=hvd.Average``, as ``DistributedOptimizer`` runs
    it, is timed too and only recorded: Horovod then also scales the result; 2026-11-25 within
    the noise of the sum's times.) The model's ring allreduce
    (:func:`hvdcompress.plan.collectives.allreduce`)::

        T(B, gamma) = 2(P-1) alpha + 2(P-1)/P · B/beta + (P-1)/P · gamma·B

    with alpha = :data:`LOOPBACK_ALPHA_S` and gamma32 numpy's float32 gamma of the calibration
    by P processes at once, the float32 time gives the loopback's beta, and the float16 time
    then Horovod's float16 gamma::

        1/beta  = (T32 - 2(P-1) alpha - (P-1)/P · gamma32·B32) · P / (2(P-1) · B32)
        gamma16 = (T16 - 2(P-1) alpha - 2(P-1)/P · B16/beta) · P / ((P-1) · B16)
                = gamma32 + (2·T16 - T32 - 2 alpha) / B16                   (P = 2)

    (clipped at 0). Its ratio to the same calibration's numpy float16 gamma scales the float16
    gamma of the calibration for ``ranks`` (a ratio holds under the machine's load, absolute
    times less so). Delete the cache file to measure again."""
    base, probe = job_calibration(ranks), probe_results()
    return replace(base, reduce={**base.reduce, "float16": probe["float16_ratio"] * base.reduce["float16"]})


def probe_results() -> dict:
    """The probe's results (:data:`PROBE_CACHE`; launched when it is not there)."""
    if not PROBE_CACHE.exists():
        calibration_for(PROBE_RANKS)   # cached before the ranks read it
        PROBE_CACHE.write_text(json.dumps(_probe_allreduce(), indent=1))
    return json.loads(PROBE_CACHE.read_text())


@functools.lru_cache(maxsize=None)
def job_calibration(ranks: int) -> cal.Calibration:
    """:func:`calibration_for` with the front ends' cost per tensor measured in the probe's job
    (:mod:`hvdcompress.torch.job_costs`)."""
    probe = probe_results()
    return replace(calibration_for(ranks), per_tensor=probe["per_tensor"], per_member=probe["per_member"])


def _probe_allreduce(numel: int = cal.REDUCE_ELEMENTS, repeats: int = PROBE_REPEATS) -> dict:
    """Launch :func:`_probe_worker` on :data:`PROBE_RANKS` ranks; solve its times for beta and
    gamma16 (see :func:`horovod_gamma`). Returns the times, the fit and the ratio."""
    ranks = PROBE_RANKS
    try:
        launch = run_script(Path(__file__).resolve(), np=ranks, timeout=PROBE_TIMEOUT_S,
                            args=["--probe-worker", "--probe-numel", numel, "--probe-repeats", repeats])
    except LaunchError as e:
        raise SystemExit(f"plan_validation: the Horovod allreduce probe failed: {e}") from None
    record = launch.results[0][-1]
    times = {key: value for key, value in record.items() if key.endswith("_s")}
    numpy = calibration_for(ranks).reduce
    alpha, share = LOOPBACK_ALPHA_S, (ranks - 1) / ranks
    b32, b16 = 4 * numel, 2 * numel
    t32, t16 = times["sum_float32_s"], times["sum_float16_s"]
    inverse_beta = (t32 - 2 * (ranks - 1) * alpha - share * numpy["float32"] * b32) / (2 * share * b32)
    gamma16 = max((t16 - 2 * (ranks - 1) * alpha - 2 * share * b16 * inverse_beta) / (share * b16), 0.0)
    return {"ranks": ranks, "numel": numel, "repeats": repeats, "seconds": times, "alpha_s": alpha,
            "beta_bytes_per_s": 1 / inverse_beta if inverse_beta > 0 else math.inf,
            "numpy_gamma": numpy, "float16_gamma": gamma16, "float16_ratio": gamma16 / numpy["float16"],
            "per_tensor": record["per_tensor"], "per_member": record["per_member"]}


def _probe_worker(numel: int, repeats: int) -> None:
    """One rank of the probe: per op (Sum, Average) and dtype, a warm-up then ``repeats`` timed
    ``hvd.allreduce`` of ``numel`` elements (the four cases taking turns), each started together
    (a barrier); rank 0 records the best times, ``<op>_<dtype>_s`` (:func:`hvdrun.write_result`:
    a file under the launcher)."""
    import time

    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    tensor, best = torch.randn(numel, generator=torch.Generator().manual_seed(hvd.rank())), {}
    cases = [(f"{op_name}_{dtype}_s", op, tensor.to(getattr(torch, dtype)))
             for op_name, op in (("sum", hvd.Sum), ("average", hvd.Average)) for dtype in ("float32", "float16")]
    for i in range(-1, repeats):   # -1: the warm-up; the cases interleaved, so load drifts hit all alike
        for key, op, x in cases:
            hvd.barrier()
            begin = time.perf_counter()
            hvd.allreduce(x, op=op, name=f"probe.{key}.{i}")
            if i >= 0:
                best[key] = min(best.get(key, math.inf), time.perf_counter() - begin)
    costs = job_costs.measure(VALIDATED, cal.load(cal.cache_path("cpu", CACHE, processes=min(hvd.size(), CORES))))
    if hvd.rank() == 0:
        write_result(0, {**best, **costs})
    hvd.shutdown()


def cluster(entry: dict, link: Link) -> Cluster:
    """Each flat rank in its own namespace (a node of one); hosts x slots: loopback inside.
    Every namespace runs on this machine's cores: cpu_share = ranks / cores."""
    slots = entry.get("slots", 1)
    loopback = Link(LOOPBACK_ALPHA_S, 2e9)
    return Cluster(entry["np"] // slots, slots, loopback, link, cpu_share(entry["np"]))


def rows_of(entry: dict) -> dict:
    """Method -> its row; a method run more than once in the launch: the mean of its numbers."""
    runs: dict = {}
    for row in entry["rows"]:
        runs.setdefault(row["method"], []).append(row)
    return {method: {key: statistics.mean(r[key] for r in rows) if isinstance(value, (int, float)) else value
                     for key, value in rows[0].items()} for method, rows in runs.items()}


def split_method(method: str) -> tuple:
    """(the method before ``@``, its ``fusion`` option as e2e reads it or None):
    ``"int8@fusion=4194304"`` -> ("int8", 4194304)."""
    from e2e import optimizer_options
    name, at, _ = method.partition("@")
    return name, optimizer_options(method).get("fusion") if at else None


def known(method: str, front_end: str) -> bool:
    return split_method(method)[0] in FRONT_ENDS[front_end]


def profile_of(floor_entry: dict):
    """The tensors' ready times from the compute floor (``nocomm``) of ``floor_entry``."""
    floor = rows_of(floor_entry)["nocomm"]
    return from_sizes(shapes(floor_entry["model"]), floor["fwd_bwd_s"], floor["sync_update_s"])


def predict_setting(entry: dict, link: Link, floor_entry: dict, methods: list, front_end: str) -> dict:
    """The model's prediction for each of ``methods`` (e2e names) in the setting of ``entry``:
    with the collective of fewer bytes (the engine's own choice); ``@fusion=B`` on the profile's
    buckets (:func:`hvdcompress.plan.profile.fused`)."""
    calibration = (horovod_gamma if front_end == "horovod" else job_calibration)(entry["np"])
    profile, out = profile_of(floor_entry), {}
    for method in methods:
        name, fusion = split_method(method)
        label = FRONT_ENDS[front_end][name]
        threshold = check_fusion(fusion, from_params(DEFAULT_COMPRESSORS[label]))   # bytes (True: the default)
        rows = predict(profile if threshold is None else fused(profile, threshold), cluster(entry, link),
                       {label: DEFAULT_COMPRESSORS[label]}, levels=("flat",), calibration=calibration,
                       baseline=profile, front_end=GRADIENT_COPIES[front_end])
        out[method] = min(rows, key=lambda row: row.wire_bytes_per_rank)
    return out


#: wire bytes per payload byte of TCP over the emulated Ethernet (tbf counts whole frames):
#: 1514-byte frames carry 1448 payload bytes, and each direction also carries the other's ACKs
#: (66 bytes per two frames, in both directions when both send)
WIRE_PER_PAYLOAD = (1514 + 33) / 1448


def fit_link(entry: dict, probe: str, front_end: str) -> Link:
    """The beta (alpha fixed at :data:`ALPHA_S`) with which the model predicts the measured
    dense step ``probe`` of ``entry`` exactly: bisection in log(beta), the predicted step falling
    as beta grows (10 kB/s to 1 TB/s). Its CPU part: the excess of 1/beta over the wire's
    seconds per byte at the emulated rate (TCP over Ethernet, :data:`WIRE_PER_PAYLOAD`)."""
    def link(log_beta: float) -> Link:
        return Link(ALPHA_S, math.exp(log_beta), half_duplex_pairs=True)   # Gloo over TCP

    measured = rows_of(entry)[probe]["step_s"]
    low, high = math.log(1e4), math.log(1e12)
    for _ in range(50):
        mid = (low + high) / 2
        step = predict_setting(entry, link(mid), entry, [probe], front_end)[probe].step_time_s
        low, high = (mid, high) if step > measured else (low, mid)
    fitted = link((low + high) / 2)
    wire_s_per_byte = WIRE_PER_PAYLOAD * 8 / entry["rate_bps"]
    return replace(fitted, cpu_s_per_byte=max(1 / fitted.beta_bytes_per_s - wire_s_per_byte, 0.0))


def validate(e2e: dict, front_end: str) -> dict:
    methods_of = FRONT_ENDS[front_end]
    probe_method = next(iter(methods_of))
    by_rate: dict = {}
    for key, entry in e2e.items():
        by_rate.setdefault(entry["rate"], []).append((key, entry))
    report, errors, fastest = {"settings": {}}, [], []
    inside, inside_fastest = [], []   # the settings where every rank has a core (the model's premise)
    for rate, entries in sorted(by_rate.items()):
        probe_key, probe = min(entries, key=lambda ke: (ke[1].get("slots", 1), ke[1]["np"]))
        link = fit_link(probe, probe_method, front_end)
        for key, entry in sorted(entries):
            rows = rows_of(entry)
            methods = [m for m in rows if known(m, front_end)]
            best = predict_setting(entry, link, probe, methods, front_end)
            lines = []
            for m in methods:
                measured, model_s = rows[m]["step_s"], best[m].step_time_s
                error = model_s / measured - 1
                is_probe = key == probe_key and m == probe_method
                if not is_probe:
                    errors.append(abs(error))
                    if entry["np"] <= CORES:
                        inside.append(abs(error))
                lines.append({"method": m, "collective": best[m].collective,
                              "measured_s": measured, "predicted_s": model_s, "error": error,
                              "probe": is_probe})
            right = min(lines, key=lambda r: r["measured_s"])["method"] == \
                min(lines, key=lambda r: r["predicted_s"])["method"]
            fastest.append(right)
            if entry["np"] <= CORES:
                inside_fastest.append(right)
            report["settings"][key] = {"link": {"alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s,
                                                "cpu_s_per_byte": link.cpu_s_per_byte},
                                       "fastest_right": right, "methods": lines}
    report["median_abs_error"] = statistics.median(errors) if errors else math.nan
    report["worst_abs_error"] = max(errors) if errors else math.nan
    report["fastest_right"] = f"{sum(fastest)}/{len(fastest)}"
    report["a_core_per_rank"] = {"cores": CORES, "median_abs_error": statistics.median(inside) if inside else math.nan,
                                 "worst_abs_error": max(inside) if inside else math.nan,
                                 "fastest_right": f"{sum(inside_fastest)}/{len(inside_fastest)}"}
    return report


def print_report(report: dict) -> None:
    for key, setting in report["settings"].items():
        beta = setting["link"]["beta_bytes_per_s"] * 8 / 1e6
        cpu = setting["link"]["cpu_s_per_byte"] * 1e9
        print(f"\n== {key} (fitted beta {beta:.0f} Mbit/s, {cpu:.2f} ns/byte of it CPU; fastest predicted "
              f"{'right' if setting['fastest_right'] else 'WRONG'})")
        print(f"{'method':<34} {'collective':<10} {'measured s':>10} {'predicted s':>11} {'error':>7}")
        for r in setting["methods"]:
            print(f"{r['method']:<34} {r['collective']:<10} {r['measured_s']:>10.3f} "
                  f"{r['predicted_s']:>11.3f} {r['error']:>+7.0%}{'  (probe)' if r['probe'] else ''}")
    print(f"\nmedian |error| {report['median_abs_error']:.0%}, worst {report['worst_abs_error']:.0%}, "
          f"fastest method right in {report['fastest_right']} settings")
    own = report["a_core_per_rank"]
    print(f"settings with a core per rank (ranks <= {own['cores']}): median |error| "
          f"{own['median_abs_error']:.0%}, worst {own['worst_abs_error']:.0%}, fastest right in "
          f"{own['fastest_right']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--e2e", default=str(HERE / "results" / "e2e_validation.json"))
    ap.add_argument("--json", default=str(HERE / "results" / "plan_validation.json"))
    ap.add_argument("--probe-worker", action="store_true", help=argparse.SUPPRESS)   # a rank of the probe
    ap.add_argument("--probe-numel", type=int, default=cal.REDUCE_ELEMENTS, help=argparse.SUPPRESS)
    ap.add_argument("--probe-repeats", type=int, default=PROBE_REPEATS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe_worker:
        return _probe_worker(args.probe_numel, args.probe_repeats)
    e2e = json.loads(Path(args.e2e).read_text())
    report = {}
    for front_end, methods in FRONT_ENDS.items():
        if not any(next(iter(methods)) in rows_of(entry) for entry in e2e.values()):
            continue   # no probe (dense) of this front end in these launches
        print(f"\n##### {front_end} front end")
        report[front_end] = validate(e2e, front_end)
        print_report(report[front_end])
    report["horovod"]["float16_gamma_probe"] = json.loads(PROBE_CACHE.read_text())
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
