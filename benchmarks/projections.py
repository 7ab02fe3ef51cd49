"""PROJECTIONS (model output, not measurements): hvdcompress.plan's predicted step time of
ResNet-50, BERT-Large and a 1.3B GPT at 16 ... 1024 GPUs (8 per node) over 10, 25 and 100 Gbit/s.

The tensor lists are written down below (torchvision's ResNet-50: 25.6M parameters; BERT-Large:
335M; a GPT-2-style 1.3B: 24 layers of width 2048). Assumptions, all visible here:

* compute per step (forward + backward, one GPU), from 6·params·tokens FLOPs at 125 TFLOP/s
  achieved (an A100 at 40% of its bf16 peak) for the transformers, and ~2,500 images/s for
  ResNet-50 at 64 images per GPU; the optimizer's time is left out;
* NVLink-class 300 GB/s and 2 us within a node; 20 us per message between nodes;
* codec time is left out (no GPU calibration here: ``python -m hvdcompress.plan --calibrate``
  on the target GPU gives it), so compressors with costly codecs (top-k on large tensors) are
  flattered;
* Horovod's defaults: 128 MiB fusion buffer, 1 ms cycle.

Writes benchmarks/results/projections.json and projections.png (when matplotlib is
installed); prints the speed-up of the best compressor over dense and fp16 for each case, and
published anchors beside them as text.

    .venv/bin/python benchmarks/projections.py [--gpus 16,32,...] [--gbit 10,25,100]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hvdcompress.plan import Cluster, Link, from_sizes, predict, recommend
from hvdcompress.plan.plot import plot_lines

RESULTS = Path(__file__).parent / "results"
GPUS_PER_NODE = 8
INTRA = Link(2e-6, 300e9)
INTER_ALPHA = 20e-6
ACHIEVED_FLOPS = 125e12
ANCHORS = [
    "1-bit Adam (Tang et al., ICML 2021): up to 3.3x higher throughput than uncompressed Adam for "
    "BERT-Large pre-training, up to 256 GPUs, on TCP/Ethernet clusters",
    "HiPress (Bai et al., SOSP 2021): compression-aware synchronisation evaluated at up to 128 GPUs "
    "(16 nodes of 8) over 100 Gbit/s; compare its reported speed-ups with the 100 Gbit/s rows",
]


def resnet50() -> list:
    """torchvision's resnet50 parameters in forward order (conv weights, batch-norm pairs, fc)."""
    sizes = [[64, 3, 7, 7], 64, 64]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            sizes += [[width, inplanes, 1, 1], width, width, [width, width, 3, 3], width, width,
                      [4 * width, width, 1, 1], 4 * width, 4 * width]
            if block == 0:
                sizes += [[4 * width, inplanes, 1, 1], 4 * width, 4 * width]
            inplanes = 4 * width
    return sizes + [[1000, 2048], 1000]


def transformer(layers: int, width: int, vocab: int, positions: int, types: int = 0) -> list:
    """Embeddings, then per layer: qkv and output projections, MLP (4x), two layer norms."""
    sizes = [[vocab, width], [positions, width]] + ([[types, width]] if types else []) + [width, width]
    for _ in range(layers):
        sizes += [[3 * width, width], 3 * width, [width, width], width, width, width,
                  [4 * width, width], 4 * width, [width, 4 * width], width, width, width]
    return sizes + [width, width]


MODELS = {
    # name: (sizes, compute seconds per step on one GPU)
    "ResNet-50": (resnet50(), 64 / 2500),
    "BERT-Large": (transformer(24, 1024, 30522, 512, 2), None),     # 32 x 128 tokens per GPU
    "GPT 1.3B": (transformer(24, 2048, 50304, 2048), None),          # 8 x 2048 tokens per GPU
}
TOKENS = {"BERT-Large": 32 * 128, "GPT 1.3B": 8 * 2048}


def compute_s(name: str) -> float:
    """Forward + backward seconds of one step on one GPU (see the module doc)."""
    sizes, seconds = MODELS[name]
    return seconds if seconds is not None else 6 * from_sizes(sizes).numel * TOKENS[name] / ACHIEVED_FLOPS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="16,32,64,128,256,512,1024")
    ap.add_argument("--gbit", default="10,25,100")
    args = ap.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    gbits = [float(g) for g in args.gbit.split(",")]
    rows, series = [], {}
    print("PROJECTIONS from the cost model (not measured); codec time left out")
    print("| model | Gbit/s | GPUs | dense ms | fp16 ms | best | best ms | vs dense | vs fp16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (sizes, _) in MODELS.items():
        profile = from_sizes(sizes, compute_s(name))
        for gbit in gbits:
            for count in gpus:
                cluster = Cluster(count // GPUS_PER_NODE, GPUS_PER_NODE, INTRA, Link(INTER_ALPHA, gbit * 1e9 / 8))
                predictions = predict(profile, cluster)
                best = recommend(predictions)
                dense = best.step_time_s * best.speedup_vs_dense
                fp16 = best.step_time_s * best.speedup_vs_fp16
                rows += [dict(vars(p), model=name, gbit=gbit, gpus=count, params=profile.numel,
                              compute_s=profile.compute_s) for p in predictions]
                print(f"| {name} | {gbit:g} | {count} | {dense * 1e3:.1f} | {fp16 * 1e3:.1f} | "
                      f"{best.compressor} ({best.collective}, {best.level}) | {best.step_time_s * 1e3:.1f} | "
                      f"{best.speedup_vs_dense:.2f}x | {best.speedup_vs_fp16:.2f}x |")
                series.setdefault(f"{name} {gbit:g}G dense", []).append((count, dense / profile.compute_s))
                series.setdefault(f"{name} {gbit:g}G best", []).append((count, best.step_time_s / profile.compute_s))
    print("Published anchors (text, not reproduced here):")
    for anchor in ANCHORS:
        print(f"  - {anchor}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "projections.json").write_text(json.dumps(
        {"label": "PROJECTION (cost model, codec time excluded)", "gpus_per_node": GPUS_PER_NODE,
         "intra": vars(INTRA), "inter_alpha_s": INTER_ALPHA, "anchors": ANCHORS, "rows": rows}, indent=1))
    try:
        path = plot_lines({k: v for k, v in series.items() if "25G" in k or "10G" in k},
                          RESULTS / "projections.png", "PROJECTION: step time / compute time "
                          "(dense vs best compressor), 8 GPUs per node", xlabel="GPUs",
                          ylabel="step time / compute time")
        print(f"wrote {path}")
    except RuntimeError as error:
        print(f"no plot: {error}")


if __name__ == "__main__":
    main()
