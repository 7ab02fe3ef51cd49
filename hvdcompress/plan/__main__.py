"""Command line of the cost model: predicted step time of each compressor × collective × level.

    python -m hvdcompress.plan --sizes sizes.json --compute-ms 120 --nodes 4 --gpus-per-node 8 \\
        --inter 25gbit --intra 300gbyte --latency 10us [--compressors none fp16 "compressor=topk,k=0.001"]
    python -m hvdcompress.plan --model torchvision.models:resnet50 --input-shape 32,3,224,224 ...
    python -m hvdcompress.plan --calibrate          # codec times of this machine, cached
    horovodrun -np 2 python -m hvdcompress.plan --calibrate-job   # then: the cost per tensor in a job
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..registry import from_params, parse_params
from ..torch import job_costs
from . import calibration as cal
from .device import torch_device
from .exchanges import COLLECTIVES, LEVELS
from .front_ends import FRONT_ENDS
from .links import Cluster, Link, cpu_share, parse_bandwidth, parse_latency
from .model import predict, recommend
from .payloads import DEFAULT_COMPRESSORS, FP16, spec_key
from .pipeline import Fusion
from .plot import plot_lines
from .profile import ModelProfile, from_sizes, fused, trace_keras, trace_torch


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hvdcompress.plan", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("the model (one of)")
    src.add_argument("--model", help="MODULE:FUNCTION returning a torch.nn.Module or a Keras model")
    src.add_argument("--input-shape", help="the traced input's shape, e.g. 32,3,224,224 (with --model)")
    src.add_argument("--input-dtype", default="float32", help="torch input dtype (int64: zeros)")
    src.add_argument("--sizes", type=Path, help="JSON list of tensor sizes (element counts or shapes), "
                                                "in forward order")
    src.add_argument("--compute-ms", type=float, default=0.0,
                     help="with --sizes: forward+backward time of one step (0: no overlap)")
    src.add_argument("--optimizer-ms", type=float, default=0.0, help="with --sizes: the optimizer step")
    net = ap.add_argument_group("the cluster")
    net.add_argument("--nodes", type=int, default=1)
    net.add_argument("--gpus-per-node", type=int, default=8)
    net.add_argument("--inter", default="25gbit", help="bandwidth between nodes (a node's NIC)")
    net.add_argument("--intra", default="300gbyte", help="bandwidth within a node, per rank")
    net.add_argument("--latency", default="10us", help="latency of a message between nodes")
    net.add_argument("--intra-latency", default="2us", help="latency of a message within a node")
    net.add_argument("--gloo", action="store_true",
                     help="Gloo over TCP: a pairwise exchange's two directions take turns (all-to-all; "
                          "allgather at 2 ranks)")
    net.add_argument("--cpu-cores", type=int, default=0,
                     help="CPU ranks: cores per node; more ranks than cores time-share them "
                          "(compute, codec and sums stretch by gpus-per-node / cores). 0: GPU ranks")
    what = ap.add_argument_group("what to compare")
    what.add_argument("--compressors", nargs="+", metavar="C", default=list(DEFAULT_COMPRESSORS),
                      help=f"labels ({', '.join(DEFAULT_COMPRESSORS).replace('%', '%%')}) or from_params specs "
                           "'compressor=topk,k=0.001'")
    what.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    what.add_argument("--levels", nargs="+", choices=LEVELS, default=list(LEVELS))
    what.add_argument("--intra-node", default=FP16, help="two-level's node compressor (label or spec)")
    what.add_argument("--front-end", choices=sorted(FRONT_ENDS), default="horovod",
                      help="ddp: the DDP hook, whose buckets copy every gradient (hvdcompress.plan.front_ends)")
    hvd = ap.add_argument_group("Horovod (defaults: HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME or 128 MiB, 1 ms)")
    defaults = Fusion.from_env()
    hvd.add_argument("--fusion-threshold", type=int, default=defaults.threshold_bytes, help="bytes")
    hvd.add_argument("--cycle-ms", type=float, default=defaults.cycle_s * 1e3)
    what.add_argument("--fused", type=int, default=0, metavar="BYTES",
                      help="hvdcompress's fusion= (bytes per fused bucket; 0: off): the compressors "
                           "that can fuse are predicted on the buckets, the others (PowerSGD) per tensor")
    codec = ap.add_argument_group("codec time")
    codec.add_argument("--calibrate", action="store_true",
                       help="measure this machine's codec times, cache them and exit")
    codec.add_argument("--calibrate-job", action="store_true",
                       help="under horovodrun: measure the front end's cost per tensor in this job "
                            "(hvdcompress.torch.job_costs), add it to the cached calibration (run "
                            "--calibrate first) and exit")
    codec.add_argument("--job-tensors", type=int, default=job_costs.TENSORS,
                       help="--calibrate-job: tensors per measurement")
    codec.add_argument("--job-steps", type=int, default=job_costs.STEPS, help="--calibrate-job: steps timed")
    codec.add_argument("--device", default="", help="cpu or cuda (default: cuda when available)")
    codec.add_argument("--processes", type=int, default=1,
                       help="calibrate in this many processes at once (CPU ranks per node, at most "
                            "its cores: they share memory bandwidth); reads that calibration")
    codec.add_argument("--cache-dir", type=Path, help="default ~/.cache/hvdcompress")
    codec.add_argument("--no-codec", action="store_true", help="leave codec time out")
    out = ap.add_argument_group("output")
    out.add_argument("--plot", type=Path, help="PNG of step time against the number of nodes")
    out.add_argument("--plot-nodes", default="1,2,4,8,16,32,64", help="node counts of --plot")
    out.add_argument("--json", type=Path, help="write the predictions as JSON")
    return ap


def _spec(text: str) -> tuple:
    """(label, spec) of a --compressors item; the spec is checked by building it."""
    spec = DEFAULT_COMPRESSORS.get(text) or parse_params(text)
    from_params(spec)
    return text, spec


def _profile(args: argparse.Namespace) -> ModelProfile:
    if (args.model is None) == (args.sizes is None):
        raise ValueError("give one of --model MODULE:FUNCTION (with --input-shape) or --sizes FILE.json")
    if args.sizes is not None:
        try:
            sizes = json.loads(args.sizes.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--sizes {args.sizes}: {error}; allowed: a JSON list of element "
                             "counts or shapes, e.g. [1000, [64, 3, 7, 7]]") from None
        if not isinstance(sizes, list) or not sizes:
            raise ValueError(f"--sizes {args.sizes}: not a non-empty JSON list")
        return from_sizes(sizes, args.compute_ms / 1e3, args.optimizer_ms / 1e3)
    if args.input_shape is None:
        raise ValueError("--model needs --input-shape, e.g. --input-shape 32,3,224,224")
    module, _, function = args.model.partition(":")
    if not function:
        raise ValueError(f"--model {args.model!r}: allowed: MODULE:FUNCTION, e.g. torchvision.models:resnet50")
    model = getattr(importlib.import_module(module), function)()
    shape = [int(s) for s in args.input_shape.split(",")]
    if hasattr(model, "named_parameters"):
        return trace_torch(model, shape, args.input_dtype, args.device or None)
    return trace_keras(model, shape)


def _table(rows: list, profile: ModelProfile, cluster: Cluster, codec_note: str) -> str:
    lines = [f"{len(profile.tensors)} tensors, {profile.numel / 1e6:.1f}M parameters; compute "
             f"{profile.compute_s * 1e3:.1f} ms; {cluster.nodes} nodes x {cluster.gpus_per_node} "
             f"GPUs; {codec_note}",
             f"{'compressor':<16} {'collective':<10} {'level':<9} {'step ms':>9} {'MB/rank':>9} "
             f"{'vs dense':>8} {'vs fp16':>8}"]
    for r in rows:
        lines.append(f"{r.compressor:<16} {r.collective:<10} {r.level:<9} {r.step_time_s * 1e3:>9.2f} "
                     f"{r.wire_bytes_per_rank / 1e6:>9.2f} {r.speedup_vs_dense:>7.2f}x {r.speedup_vs_fp16:>7.2f}x")
    best = recommend(rows)
    lines.append(f"recommended: {best.compressor} ({best.collective}, {best.level}): "
                 f"{best.step_time_s * 1e3:.2f} ms, {best.speedup_vs_dense:.2f}x dense, "
                 f"{best.speedup_vs_fp16:.2f}x fp16")
    return "\n".join(lines)


def _calibration(args: argparse.Namespace, specs: list) -> tuple:
    """(calibration or None, a note saying which); --calibrate measures and exits."""
    if args.no_codec:
        return None, "codec time left out (--no-codec)"
    device = torch_device(args.device).name
    path = cal.cache_path(device, args.cache_dir, processes=args.processes)
    if args.calibrate:
        calibration = cal.calibrate(specs, device=device, processes=args.processes)
        print(f"calibrated {len(calibration.codecs)} compressors on {device}: {cal.save(calibration, path)}")
        return calibration, ""
    calibration = cal.load(path)
    if calibration is None:
        if args.calibrate_job:
            raise ValueError(f"--calibrate-job: no {path} to add to; run with --calibrate first")
        return None, f"codec time not modelled (no {path.name}; run with --calibrate)"
    if args.calibrate_job:
        return _calibrate_job(args, specs, calibration, path), ""
    measured = "" if calibration.per_tensor else " (cost per tensor not measured: --calibrate-job)"
    return calibration, f"codec time from {path.name}{measured}"


def _calibrate_job(args: argparse.Namespace, specs: list, calibration: cal.Calibration, path: Path) -> cal.Calibration:
    """--calibrate-job: every rank measures (:func:`job_costs.measure`); rank 0 saves."""
    import horovod.torch as hvd

    hvd.init()
    if hvd.size() < 2:
        raise ValueError(f"--calibrate-job: {hvd.size()} rank; run it under horovodrun with at least 2 "
                         "(e.g. horovodrun -np 2 python -m hvdcompress.plan --calibrate-job)")
    costs = job_costs.measure({spec_key(s): s for s in specs}, calibration, args.job_tensors,
                              steps=args.job_steps)
    calibration = replace(calibration, per_tensor={**calibration.per_tensor, **costs["per_tensor"]},
                          per_member={**calibration.per_member, **costs["per_member"]})
    if hvd.rank() == 0:
        print(f"measured the cost per tensor of {len(costs['per_tensor'])} compressors in a job of "
              f"{hvd.size()} ranks: {cal.save(calibration, path)}")
    return calibration


def main(argv: Optional[list] = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        specs = dict(_spec(c) for c in args.compressors)
        intra = _spec(args.intra_node)[1]
        calibration, note = _calibration(args, [*specs.values(), intra])
        if args.calibrate or args.calibrate_job:
            return 0
        profile = _profile(args)
        inter = Link(parse_latency("--latency", args.latency), parse_bandwidth("--inter", args.inter),
                     half_duplex_pairs=args.gloo)
        intra_link = Link(parse_latency("--intra-latency", args.intra_latency),
                          parse_bandwidth("--intra", args.intra), half_duplex_pairs=args.gloo)
        share = cpu_share(args.gpus_per_node, args.cpu_cores) if args.cpu_cores > 0 else 1.0
        cluster = Cluster(args.nodes, args.gpus_per_node, intra_link, inter, share)
        fusion = Fusion(args.fusion_threshold, args.cycle_ms / 1e3)
        plot_nodes = [int(n) for n in args.plot_nodes.split(",")] if args.plot else []
    except ValueError as error:
        ap.error(str(error))

    fusable = {k: v for k, v in specs.items() if from_params(v).unwrap().fusable} if args.fused else {}
    alone = {k: v for k, v in specs.items() if k not in fusable}
    bucketed = fused(profile, args.fused) if args.fused else profile
    front_end = FRONT_ENDS[args.front_end]

    def run(nodes: int) -> list:
        at = replace(cluster, nodes=nodes)
        rows = predict(bucketed, at, fusable, args.collectives, args.levels, intra, calibration, fusion,
                       baseline=profile, front_end=front_end) if fusable else []
        return rows + (predict(profile, at, alone, args.collectives, args.levels, intra, calibration, fusion,
                               front_end=front_end) if alone else [])

    rows = run(cluster.nodes)
    if args.fused:
        note += f"; fusion={args.fused}: {len(bucketed.tensors)} exchanged tensors or buckets"
    print(_table(rows, profile, cluster, note))
    if args.json:
        args.json.write_text(json.dumps([vars(r) for r in rows], indent=1))
    if args.plot:
        series: dict = {}
        for nodes in plot_nodes:
            at_nodes = run(nodes)
            for label in specs:
                best = recommend(r for r in at_nodes if r.compressor == label)
                series.setdefault(label, []).append((nodes, best.step_time_s * 1e3))
        print(f"wrote {plot_lines(series, args.plot, f'{args.inter} between nodes of {cluster.gpus_per_node} GPUs')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
