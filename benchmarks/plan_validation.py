"""The cost model (:mod:`hvdcompress.plan`) against step times measured on the emulated network.

Measure first (root: network namespaces), every method of a setting in one launch::

    sudo .venv/bin/python benchmarks/e2e.py --models mlp --nps 2,4 --rates 100mbit,1gbit,10gbit \\
        --methods nocomm,hvd-dense,hvd-fp16,int8,onebit-ef,dgc,csc,powersgd,ddp-dense,ddp-fp16,\\
ddp-powersgd,ddp:powersgd,ddp:int8,ddp:onebit-ef,ddp:dgc \\
        --json benchmarks/results/e2e_validation.json

then predict and compare::

    .venv/bin/python benchmarks/plan_validation.py [--e2e benchmarks/results/e2e_validation.json]

What the model is given, per setting (model, ranks or hosts x slots, rate): the model's tensor
shapes; the compute floor measured in the same launch (``nocomm``: forward + backward, then the
optimizer step; the backward's share of it spread over the tensors as
:func:`hvdcompress.plan.profile.from_sizes` does); this machine's codec calibration at one
thread, as each rank runs (cached apart from the plan's own), slowed by ``ranks / cores`` when
the ranks outnumber the cores;
Horovod's fusion defaults. The links are *fitted*, not assumed: alpha and beta of each rate from
the dense Horovod step at the fewest ranks measured at that rate (the probe), by inverting the
ring formula with the fitted alpha; those probe rows are left out of the error statistics.
Reported, for the Horovod front end and the DDP hook (the same exchange engine, other
launch overheads) separately: per method the predicted and measured step and the relative
error; the median and worst absolute error; and per setting whether the fastest method is
predicted correctly.
Writes ``benchmarks/results/plan_validation.json``.
"""
from __future__ import annotations

import argparse
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
from hvdcompress.plan.links import Cluster, Link  # noqa: E402
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


def calibration_for(ranks: int) -> cal.Calibration:
    """This machine's codec calibration (cached), each time scaled by ranks / cores when the
    ranks share fewer cores."""
    import torch
    torch.set_num_threads(1)
    specs = [DEFAULT_COMPRESSORS[m] for methods in FRONT_ENDS.values() for m in methods.values()]
    path = cal.cache_path("cpu", CACHE)
    base = cal.load(path)
    if base is None or any(base.times(s) is None for s in specs):
        base = cal.calibrate(specs, device="cpu")
        cal.save(base, path)
    share = max(1.0, ranks / (os.cpu_count() or 1))
    scaled = {k: cal.CodecTimes(*(cal.Fit(f.a * share, f.b * share) for f in (v.compress, v.decode, v.decode4)))
              for k, v in base.codecs.items()}
    return replace(base, codecs=scaled)


def cluster(entry: dict, link: Link) -> Cluster:
    """Each flat rank in its own namespace (a node of one); hosts x slots: loopback inside."""
    slots = entry.get("slots", 1)
    loopback = Link(10e-6, 2e9)
    return Cluster(entry["np"] // slots, slots, loopback, link)


def rows_of(entry: dict) -> dict:
    return {r["method"]: r for r in entry["rows"]}


def fit_link(entry: dict, probe: str) -> Link:
    """beta from the dense step at the probe setting: the wire time is the measured step less
    the compute floor, and a ring allreduce of B bytes costs 2(P-1)/P·B/beta (+ alpha terms)."""
    rows = rows_of(entry)
    p, dense = entry["np"], rows[probe]
    params = dense["params"]
    wire_s = dense["step_s"] - rows["nocomm"]["step_s"] - 2 * (p - 1) * ALPHA_S
    return Link(ALPHA_S, 2 * (p - 1) / p * 4 * params / max(wire_s, 1e-6))


def validate(e2e: dict, front_end: str) -> dict:
    methods_of = FRONT_ENDS[front_end]
    probe_method = next(iter(methods_of))
    by_rate: dict = {}
    for key, entry in e2e.items():
        by_rate.setdefault(entry["rate"], []).append((key, entry))
    report, errors, fastest = {"settings": {}}, [], []
    for rate, entries in sorted(by_rate.items()):
        probe_key, probe = min(entries, key=lambda ke: (ke[1].get("slots", 1), ke[1]["np"]))
        link = fit_link(probe, probe_method)
        for key, entry in sorted(entries):
            rows = rows_of(entry)
            floor = rows["nocomm"]
            profile = from_sizes(shapes(entry["model"]), floor["fwd_bwd_s"], floor["sync_update_s"])
            methods = [m for m in methods_of if m in rows]
            predicted = predict(profile, cluster(entry, link),
                                {methods_of[m]: DEFAULT_COMPRESSORS[methods_of[m]] for m in methods},
                                levels=("flat",), calibration=calibration_for(entry["np"]))
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
            report["settings"][key] = {"link": {"alpha_s": link.alpha_s, "beta_bytes_per_s": link.beta_bytes_per_s},
                                       "fastest_right": right, "methods": lines}
    report["median_abs_error"] = statistics.median(errors) if errors else math.nan
    report["worst_abs_error"] = max(errors) if errors else math.nan
    report["fastest_right"] = f"{sum(fastest)}/{len(fastest)}"
    return report


def print_report(report: dict) -> None:
    for key, setting in report["settings"].items():
        beta = setting["link"]["beta_bytes_per_s"] * 8 / 1e6
        print(f"\n== {key} (fitted beta {beta:.0f} Mbit/s; fastest predicted "
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
