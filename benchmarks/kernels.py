"""Compression throughput: the C++ kernels against the plain-torch implementation of the same
algorithms, and a memcpy of the same size as the ceiling, all in one run (the memcpy is timed
again right after each compressor, and each ratio taken against that neighbour).

For each size (float32 elements) and compressor: compress and decompress (one rank's payload,
decoded into a preallocated output buffer, as the torch optimizer decodes into ``p.grad``)
throughput in GB/s of input (4·n bytes / time), best of at least ``--repeat`` runs (and of as
many as fit in half a second) after a warm-up, on
the kernel path (``TorchOps(kernels=True)``) and on the pure-torch path (``kernels=False``, the
fallback, which is the straightforward torch code of the same algorithm), and their ratio.
Prints a table and writes JSON (default benchmarks/results/kernels.json)::

    python benchmarks/kernels.py --sizes 1M,25M,100M

``--device cuda`` times the same on a GPU: the kernel path is then the Triton kernels
(``TorchOps(kernels="triton")``, needs ``pip install hvdcompress[gpu]``), the ceiling a device
memcpy, and each run is timed with CUDA events around it (default output
benchmarks/results/kernels_cuda.json)::

    python benchmarks/kernels.py --device cuda --sizes 1M,25M,100M

``--tf`` also times the TensorFlow path (TFOps, eager, on the same C++ kernels; decoders allocate
their output, as TensorFlow tensors are immutable) and prints compress + decompress ms next to
the torch kernels'; ``--tf-before OLD.json`` adds the TF ms of an earlier ``--tf`` run (e.g. of
the tree before a change to the TF path) to the same lines and rows.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable, Optional

import torch

import hvdcompress as hc
from hvdcompress.contract.compressor import Compressor, TensorInfo
from hvdcompress.ops.torch_ops import TorchOps

COMPRESSORS: dict = {
    "onebit": lambda: hc.OneBit(),
    "onebit rows": lambda: hc.OneBit(chunk="rows"),  # a scale per row of 1000 (the Adam take-over's)
    "efsignsgd": lambda: hc.EFSignSGD(),
    "signum": lambda: hc.Signum(),
    "twobit": lambda: hc.TwoBit(0.5),
    "int8": lambda: hc.Int8(2048),
    "dithering": lambda: hc.Dithering(8, "natural", "max"),
    "qsgd": lambda: hc.QSGD(64),
    "terngrad": lambda: hc.TernGrad(),
    "natural": lambda: hc.Natural(),
    "threshold": lambda: hc.Threshold(2.5),
    "powersgd": lambda: hc.PowerSGD(rank=4),
    "fp16": lambda: hc.FP16(),
    "bf16": lambda: hc.BF16(),
    "topk": lambda: hc.TopK(0.01),
    "randomk": lambda: hc.RandomK(0.01),
    "dgc": lambda: hc.DGC(0.99, min_numel=0),
    "csc": lambda: hc.from_params({"compressor": "csc", "ratio": "0.01", "min_numel": "0"}),
    "onebit+ef": lambda: hc.ErrorFeedback(hc.OneBit()),  # the generic error-feedback decorator
}
# Decode into their state buffer (out=residual), which TensorFlow can do only into a tf.Variable:
# timed on TF with the tf.Variable state that TF training keeps (the others with a plain dict,
# as torch, so that both time the same work).
TF_VARIABLE_STATE = {"onebit+ef"}
TARGET_EXEMPT = {"fp16", "bf16", "topk"}  # casts and exact top-k: no 3x target


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}.get(text[-1], 1)
    return int(float(text.rstrip("KMG")) * scale)


def run_time(fn: Callable[[], object], device: str) -> float:
    """Seconds one call of ``fn`` takes: wall clock on the CPU; on a GPU, between CUDA events
    recorded on the current stream before and after it (waiting for the second)."""
    if device == "cpu":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def best_time(fn: Callable[[], object], repeat: int, device: str = "cpu", budget: float = 0.5) -> float:
    """The fastest of at least ``repeat`` runs after a warm-up, running on while the total is
    under ``budget`` seconds (the machines are shared: the minimum is the least disturbed run)."""
    fn()
    best, spent, runs = float("inf"), 0.0, 0
    while runs < repeat or spent < budget:
        elapsed = run_time(fn, device)
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best


def time_compressor(make: Callable[[], Compressor], ops: TorchOps, x: torch.Tensor,
                    repeat: int, state: Optional[dict] = None) -> tuple:
    """(compress seconds, decompress seconds) of one rank's gradient ``x``."""
    n = ops.numel(x)
    cols = 1000 if n % 1000 == 0 else 1
    info = TensorInfo(name="bench", numel=n, shape=(n // cols, cols))
    comp, state = make(), ({} if state is None else state)
    comp.init_state(ops, x, state, info)

    def compress():
        packet = comp.compress(ops, x, state, info)
        return packet.resume(packet.tensors) if packet.resume else packet

    device = x.device.type if isinstance(x, torch.Tensor) else "cpu"
    packet = compress()
    t_compress = best_time(compress, repeat, device)
    out = torch.empty_like(x) if isinstance(x, torch.Tensor) else None  # TF decoders allocate
    decompress = (lambda: comp.decompress_gathered(ops, packet.tensors, packet.ctx, info, 1, out=out)) \
        if not packet.summable else (lambda: comp.decompress(ops, packet.tensors, packet.ctx, info, out=out))
    return t_compress, best_time(decompress, repeat, device)


def tf_state(name: str) -> Optional[dict]:
    if name not in TF_VARIABLE_STATE:
        return None
    from hvdcompress.tensorflow.state import VariableState
    return VariableState(f"bench/{name}")


def tensorflow_ops(threads: Optional[int]):
    """TFOps (the TensorFlow path, timed eagerly as TFOps runs inside tf.py_function), limited to
    ``threads`` threads; None when TensorFlow is not installed."""
    try:
        import tensorflow as tf

        from hvdcompress.ops.tf_ops import TFOps
    except ImportError:
        return None
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return TFOps()


def run(sizes: list, names: list, repeat: int, skip_fallback_above: Optional[int],
        tf_ops=None, device: str = "cpu", tf_before: Optional[dict] = None) -> dict:
    """The kernel path is the C++ kernels on the CPU, the Triton kernels on a GPU."""
    kernels = TorchOps(kernels=True if device == "cpu" else "triton")
    fallback = TorchOps(kernels=False)
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
        x_tf = tf_ops.from_numpy(x.numpy(), None) if tf_ops is not None else None
        dst = torch.empty_like(x)
        gbs = lambda t: 4 * n / t / 1e9  # noqa: E731
        t_copy = best_time(lambda: dst.copy_(x), repeat, device)
        t_clone = best_time(x.clone, repeat, device)  # a copy into fresh memory: what an allocating decoder pays
        rows.append({"size": n, "compressor": "memcpy", "compress_kernel_gbs": gbs(t_copy)})
        rows.append({"size": n, "compressor": "clone", "compress_kernel_gbs": gbs(t_clone)})
        print(f"{n:>11,} memcpy {gbs(t_copy):.2f} GB/s, clone (allocating copy) {gbs(t_clone):.2f} GB/s")
        for name in names:
            ck, dk = time_compressor(COMPRESSORS[name], kernels, x, repeat)
            # the memcpy again, next to this compressor: on a shared machine the load drifts
            t_near = best_time(lambda: dst.copy_(x), repeat, device)
            row = {"size": n, "compressor": name, "compress_kernel_gbs": gbs(ck),
                   "decompress_kernel_gbs": gbs(dk), "memcpy_gbs": gbs(t_near),
                   "compress_vs_memcpy": ck / t_near, "decompress_vs_memcpy": dk / t_near}
            if skip_fallback_above is None or n <= skip_fallback_above:
                ct, dt = time_compressor(COMPRESSORS[name], fallback, x, repeat)
                row.update(compress_torch_gbs=gbs(ct), decompress_torch_gbs=gbs(dt),
                           compress_speedup=ct / ck, decompress_speedup=dt / dk)
            if tf_ops is not None:  # TensorFlow: compress + decompress ms, next to torch's kernels
                ct, dt = time_compressor(COMPRESSORS[name], tf_ops, x_tf, repeat, tf_state(name))
                row.update(torch_ms=1e3 * (ck + dk), tf_ms=1e3 * (ct + dt), tf_vs_torch=(ct + dt) / (ck + dk))
                before = (tf_before or {}).get((n, name))
                if before is not None:
                    row["tf_before_ms"] = before
                print(f"{'':>11} {name:<10} | compress+decompress ms: torch kernels {1e3 * (ck + dk):8.2f} "
                      f"TF {1e3 * (ct + dt):8.2f}  TF/torch {(ct + dt) / (ck + dk):5.2f}"
                      + (f"  TF before {before:8.2f}" if before is not None else ""), flush=True)
            rows.append(row)
            print(format_row(row), flush=True)
    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "platform": platform.platform(), "torch": torch.__version__}
    if device == "cuda":
        import triton
        machine.update(gpu=torch.cuda.get_device_name(), triton=triton.__version__)
    return {"machine": machine, "device": device,
            "kernels": "C++" if device == "cpu" else "triton", "repeat": repeat, "rows": rows}


def load_tf_ms(path: Optional[str]) -> Optional[dict]:
    """{(size, compressor): TF compress + decompress ms} of an earlier --tf run's JSON."""
    if path is None:
        return None
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["size"], r["compressor"]): r["tf_ms"] for r in rows if "tf_ms" in r}


def format_row(r: dict) -> str:
    def f(key, fmt="{:7.2f}"):
        return fmt.format(r[key]) if key in r else " " * len(fmt.format(0.0))
    return (f"{r['size']:>11,} {r['compressor']:<10} | comp GB/s kern {f('compress_kernel_gbs')} "
            f"torch {f('compress_torch_gbs')} x{f('compress_speedup', '{:6.1f}')} "
            f"memcpy/{f('compress_vs_memcpy', '{:5.1f}')} | decomp kern {f('decompress_kernel_gbs')} "
            f"torch {f('decompress_torch_gbs')} x{f('decompress_speedup', '{:6.1f}')} "
            f"memcpy/{f('decompress_vs_memcpy', '{:5.1f}')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,25M,100M", help="comma-separated element counts")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for torch and the kernels (default: torch's default); on a "
                             "loaded shared machine 1 avoids timing the scheduler")
    parser.add_argument("--skip-torch-above", default=None,
                        help="do not time the pure-torch path above this size (it is slow)")
    parser.add_argument("--tf", action="store_true",
                        help="also time the TensorFlow path (TFOps): compress + decompress ms per "
                             "compressor next to the torch kernels'")
    parser.add_argument("--tf-before", default=None,
                        help="a JSON written by an earlier --tf run (e.g. of the tree before a change "
                             "to the TF path): its TF ms are shown and stored next to this run's")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: tensors on the GPU, the Triton kernels against plain torch and "
                             "a device memcpy")
    parser.add_argument("--out", default=None,
                        help="JSON output (default benchmarks/results/kernels.json, or "
                             "kernels_cuda.json with --device cuda)")
    args = parser.parse_args()
    if args.device == "cuda" and args.tf:
        parser.error("--tf times TensorFlow's CPU path: use it with --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)  # also the OpenMP threads the kernels use
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    skip = parse_size(args.skip_torch_above) if args.skip_torch_above else None
    results = run(sizes, args.compressors.split(","), args.repeat, skip,
                  tensorflow_ops(args.threads) if args.tf else None, args.device,
                  load_tf_ms(args.tf_before))
    default = "kernels.json" if args.device == "cpu" else "kernels_cuda.json"
    out = Path(args.out or Path(__file__).parent / "results" / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
