"""The cost model (:mod:`hvdcompress.plan`) against step times measured on the emulated network.

Measure first (root: network namespaces), every method of a setting in one launch::

    sudo .venv/bin/python benchmarks/e2e.py --models mlp --nps 2,4 --rates 100mbit,1gbit,10gbit \\
        --methods nocomm,hvd-dense,hvd-fp16,int8,onebit-ef,dgc,csc,powersgd,ddp-dense,ddp-fp16,\\
ddp-powersgd,ddp:powersgd,ddp:int8,ddp:onebit-ef,ddp:dgc \\
        --json benchmarks/results/e2e_validation.json

then predict and compare::

    .venv/bin/python benchmarks/plan_validation.py [--e2e benchmarks/results/e2e_validation.json]

What the model is given, per setting (model, ranks or hosts x slots, rate): the model's tensor
shapes; the compute floor (``nocomm``: forward + backward, then the optimizer step; the
backward's share of it spread over the tensors as :func:`hvdcompress.plan.profile.from_sizes`
does) measured at the probe (below), where every rank has a core; this machine's calibration
at one thread per process, run by min(ranks, cores) processes at once as the ranks share the
memory (cached apart from the plan's own): codec times and the reduction's gamma per dtype;
for the Horovod front end, gamma of Horovod's own Gloo sums (:func:`horovod_gamma`: its
``gloo::sum<float16>`` converts in software, about 7x numpy's float16 add; torch's Gloo, the
DDP hook's, sums at about numpy's speed);
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
import ctypes
import functools
import subprocess
import time
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
CACHE = Path.home() / ".cache" / "hvdcompress" / "one-thread"

from hvdcompress.plan import calibration as cal  # noqa: E402
from hvdcompress.plan.links import Cluster, Link, cpu_share  # noqa: E402
from hvdcompress.plan.model import predict  # noqa: E402
from hvdcompress.plan.payloads import DEFAULT_COMPRESSORS  # noqa: E402
from hvdcompress.plan.profile import from_sizes  # noqa: E402

#: per front end, e2e method -> the plan's compressor label; the first is the probe (dense)
FRONT_ENDS = {
    "horovod": {"hvd-dense": "none", "hvd-fp16": "fp16", "int8": "int8", "onebit-ef": "onebit+ef",
                "dgc": "dgc 0.999", "csc": "csc 1%", "powersgd": "powersgd r4", "topk-ef": "topk 1%"},
    "ddp": {"ddp-dense": "none", "ddp-fp16": "fp16", "ddp:int8": "int8", "ddp:onebit-ef": "onebit+ef",
            "ddp:dgc": "dgc 0.999", "ddp:powersgd": "powersgd r4"},
}
ALPHA_S = 100e-6   # per message on the emulated links (veth + Gloo's TCP); the fit takes beta


def shapes(model: str) -> list:
    from e2e import build_model
    return [tuple(p.shape) for p in build_model(model).parameters()]


@functools.lru_cache(maxsize=None)
def calibration_for(ranks: int) -> cal.Calibration:
    """This machine's calibration (cached), by as many processes at once as the ranks that run
    at once (every rank on this machine, at most one per core)."""
    import torch
    torch.set_num_threads(1)
    specs = [DEFAULT_COMPRESSORS[m] for methods in FRONT_ENDS.values() for m in methods.values()]
    processes = min(ranks, os.cpu_count() or 1)
    path = cal.cache_path("cpu", CACHE, processes=processes)
    base = cal.load(path)
    if base is None or not base.reduce or any(base.times(s) is None for s in specs):
        base = cal.calibrate(specs, device="cpu", processes=processes)
        cal.save(base, path)
    return base


#: Gloo's reduction kernels in Horovod's torch library (local symbols, found with nm)
GLOO_SUMS = {"float16": "void gloo::sum<gloo::float16>(void*, void const*, void const*, unsigned long)",
             "float32": "void gloo::sum<float>(void*, void const*, void const*, unsigned long)"}


@functools.lru_cache(maxsize=None)
def horovod_gamma(ranks: int) -> cal.Calibration:
    """:func:`calibration_for` with gamma of the sums Horovod's Gloo runs: each ``gloo::sum<T>``
    of horovod.torch's library called directly (ctypes, at its nm address) on 16M elements,
    against numpy's add in the same process; the ratio (cached beside the calibration) scales
    the calibrated numpy gamma (a ratio holds under the machine's load, absolute times not)."""
    base, path = calibration_for(ranks), CACHE / "horovod-gloo-sum-ratios.json"
    if not path.exists():
        path.write_text(json.dumps(_gloo_sum_ratios()))
    ratios = json.loads(path.read_text())
    return replace(base, reduce={dtype: ratios[dtype] * g for dtype, g in base.reduce.items()})


def _gloo_sum_ratios(repeats: int = 5) -> dict:
    """Per dtype, the best time of Horovod's ``gloo::sum<T>(c, a, b, n)`` over numpy's
    ``np.add(a, b, out=c)`` (best of ``repeats`` each)."""
    import numpy as np
    import horovod.torch.mpi_lib_v2 as lib

    path = lib.__file__
    symbols = {line[17:]: int(line[:16], 16) for line in subprocess.run(   # "<address> <type> <name>"
        ["nm", "-C", path], capture_output=True, text=True, check=True).stdout.splitlines() if line[:16].strip()}
    handle = ctypes.CDLL(path)
    origin = ctypes.cast(handle.PyInit_mpi_lib_v2, ctypes.c_void_p).value - symbols["T PyInit_mpi_lib_v2"]
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

    def best(run) -> float:
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            run()
            times.append(time.perf_counter() - begin)
        return min(times)

    rng, numel, ratios = np.random.default_rng(0), cal.REDUCE_ELEMENTS, {}
    for dtype, name in GLOO_SUMS.items():
        gloo_sum = kernel(origin + symbols[f"t {name}"])
        a, b, c = (rng.standard_normal(numel).astype(dtype) for _ in range(3))
        ratios[dtype] = best(lambda: gloo_sum(c.ctypes.data, a.ctypes.data, b.ctypes.data, numel)) / \
            best(lambda: np.add(a, b, out=c))
    return ratios


def cluster(entry: dict, link: Link) -> Cluster:
    """Each flat rank in its own namespace (a node of one); hosts x slots: loopback inside.
    Every namespace runs on this machine's cores: cpu_share = ranks / cores."""
    slots = entry.get("slots", 1)
    loopback = Link(10e-6, 2e9)
    return Cluster(entry["np"] // slots, slots, loopback, link, cpu_share(entry["np"]))


def rows_of(entry: dict) -> dict:
    return {r["method"]: r for r in entry["rows"]}


def profile_of(floor_entry: dict):
    """The tensors' ready times from the compute floor (``nocomm``) of ``floor_entry``."""
    floor = rows_of(floor_entry)["nocomm"]
    return from_sizes(shapes(floor_entry["model"]), floor["fwd_bwd_s"], floor["sync_update_s"])


def predict_setting(entry: dict, link: Link, floor_entry: dict, methods: dict, front_end: str) -> list:
    """The model's rows for ``methods`` (e2e name -> plan label) in the setting of ``entry``."""
    calibration = (horovod_gamma if front_end == "horovod" else calibration_for)(entry["np"])
    return predict(profile_of(floor_entry), cluster(entry, link),
                   {methods[m]: DEFAULT_COMPRESSORS[methods[m]] for m in methods},
                   levels=("flat",), calibration=calibration)


#: wire bytes per payload byte of TCP over the emulated Ethernet (tbf counts whole frames):
#: 1514-byte frames carry 1448 payload bytes, and each direction also carries the other's ACKs
#: (66 bytes per two frames, in both directions when both send)
WIRE_PER_PAYLOAD = (1514 + 33) / 1448


def fit_link(entry: dict, probe: str, label: str, front_end: str) -> Link:
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
        step = predict_setting(entry, link(mid), entry, {probe: label}, front_end)[0].step_time_s
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
    for rate, entries in sorted(by_rate.items()):
        probe_key, probe = min(entries, key=lambda ke: (ke[1].get("slots", 1), ke[1]["np"]))
        link = fit_link(probe, probe_method, methods_of[probe_method], front_end)
        for key, entry in sorted(entries):
            rows = rows_of(entry)
            methods = [m for m in methods_of if m in rows]
            predicted = predict_setting(entry, link, probe, {m: methods_of[m] for m in methods}, front_end)
            best = {}
            for row in predicted:   # the engine's own collective choice: the fewer bytes
                old = best.get(row.compressor)
                if old is None or row.wire_bytes_per_rank < old.wire_bytes_per_rank:
                    best[row.compressor] = row
            lines = []
            for m in methods:
                measured, model_s = rows[m]["step_s"], best[methods_of[m]].step_time_s
                error = model_s / measured - 1
                is_probe = key == probe_key and m == probe_method
                if not is_probe:
                    errors.append(abs(error))
                lines.append({"method": m, "collective": best[methods_of[m]].collective,
                              "measured_s": measured, "predicted_s": model_s, "error": error,
                              "probe": is_probe})
            right = min(lines, key=lambda r: r["measured_s"])["method"] == \
                min(lines, key=lambda r: r["predicted_s"])["method"]
            fastest.append(right)
            report["settings"][key] = {"link": {"alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s,
                                                "cpu_s_per_byte": link.cpu_s_per_byte},
                                       "fastest_right": right, "methods": lines}
    report["median_abs_error"] = statistics.median(errors) if errors else math.nan
    report["worst_abs_error"] = max(errors) if errors else math.nan
    report["fastest_right"] = f"{sum(fastest)}/{len(fastest)}"
    return report


def print_report(report: dict) -> None:
    for key, setting in report["settings"].items():
        beta = setting["link"]["beta_bytes_per_s"] * 8 / 1e6
        cpu = setting["link"]["cpu_s_per_byte"] * 1e9
        print(f"\n== {key} (fitted beta {beta:.0f} Mbit/s, {cpu:.2f} ns/byte of it CPU; fastest predicted "
              f"{'right' if setting['fastest_right'] else 'WRONG'})")
        print(f"{'method':<11} {'collective':<10} {'measured s':>10} {'predicted s':>11} {'error':>7}")
        for r in setting["methods"]:
            print(f"{r['method']:<11} {r['collective']:<10} {r['measured_s']:>10.3f} "
                  f"{r['predicted_s']:>11.3f} {r['error']:>+7.0%}{'  (probe)' if r['probe'] else ''}")
    print(f"\nmedian |error| {report['median_abs_error']:.0%}, worst {report['worst_abs_error']:.0%}, "
          f"fastest method right in {report['fastest_right']} settings")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--e2e", default=str(HERE / "results" / "e2e_validation.json"))
    ap.add_argument("--json", default=str(HERE / "results" / "plan_validation.json"))
    args = ap.parse_args()
    e2e = json.loads(Path(args.e2e).read_text())
    report = {}
    for front_end in FRONT_ENDS:
        print(f"\n##### {front_end} front end")
        report[front_end] = validate(e2e, front_end)
        print_report(report[front_end])
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
