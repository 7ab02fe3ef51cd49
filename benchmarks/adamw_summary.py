"""The Adam take-over at today's defaults, in one table and one plot (benchmarks/README.md
section 8): validation bits/byte against dense AdamW in the same launch, for each compressor,
on both language models (LSTM, causal transformer), at 2 and 8 ranks, per seed.

    .venv/bin/python benchmarks/adamw_summary.py [--plot benchmarks/results/adamw_summary.png]

The runs are the ones listed in :data:`RUNS`, each a result of ``benchmarks/convergence.py``
(the JSON file, the number of ranks, the method's key in it). Only runs at today's defaults are
listed (FrozenAdam's freeze at 750 steps for onebit, top-k, random-k and PowerSGD; int8 without
the take-over); a run not there yet reads "-". The targets are issue 20's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).resolve().parent / "results"

#: compressor -> (its gap target, the methods' keys at today's defaults)
TARGETS = {"onebit + EF": 0.03, "top-k 1% + EF": 0.05, "random-k 1% + EF": 0.05,
           "PowerSGD rank 4": 0.05, "int8": 0.01}
ONEBIT, TOPK, RANDOMK = ("onebit:ef=vanilla:adam=frozen:freeze_steps=750",
                         "topk:k=0.01:ef=vanilla:adam=frozen:freeze_steps=750",
                         "randomk:k=0.01:ef=vanilla:adam=frozen:freeze_steps=750")
POWERSGD = "powersgd:rank=4:adam=frozen:freeze_steps=750"

#: (compressor, model, ranks, seed, file, method): the runs at today's defaults (the aliases
#: onebit-ef-adam, topk-ef-adam, randomk-ef-adam and powersgd-adam where run after their
#: default became 750)
RUNS = [
    ("onebit + EF", "LSTM", 2, 0, "lm_adamw_onebit750.json", ONEBIT),
    ("onebit + EF", "LSTM", 2, 1, "lm_adamw_onebit750_seed1.json", ONEBIT),
    ("onebit + EF", "LSTM", 8, 0, "lm_adamw_np8_onebit750.json", ONEBIT),
    ("onebit + EF", "LSTM", 8, 1, "lm_adamw_np8_onebit750_seed1.json", ONEBIT),
    ("onebit + EF", "transformer", 2, 0, "lm_adamw_transformer_np2_default750.json", "onebit-ef-adam"),
    ("onebit + EF", "transformer", 2, 1, "lm_adamw_transformer_np2_default750_seed1.json", "onebit-ef-adam"),
    ("onebit + EF", "transformer", 8, 0, "lm_adamw_transformer_np8.json", "onebit-ef-adam"),
    ("onebit + EF", "transformer", 8, 1, "lm_adamw_transformer_np8_seed1.json", "onebit-ef-adam"),
    ("top-k 1% + EF", "LSTM", 2, 0, "lm_adamw_np2_default750.json", "topk-ef-adam"),
    ("top-k 1% + EF", "LSTM", 2, 1, "lm_adamw_np2_default750_seed1.json", "topk-ef-adam"),
    ("top-k 1% + EF", "LSTM", 8, 0, "lm_adamw_np8.json", "topk-ef-adam"),
    ("top-k 1% + EF", "transformer", 2, 0, "lm_adamw_transformer_np2_default750.json", "topk-ef-adam"),
    ("top-k 1% + EF", "transformer", 2, 1, "lm_adamw_transformer_np2_default750_seed1.json", "topk-ef-adam"),
    ("top-k 1% + EF", "transformer", 8, 0, "lm_adamw_transformer_np8.json", TOPK),
    ("top-k 1% + EF", "transformer", 8, 1, "lm_adamw_transformer_np8_seed1.json", "topk-ef-adam"),
    ("random-k 1% + EF", "LSTM", 2, 0, "lm_adamw_np2_localclip.json", RANDOMK),
    ("random-k 1% + EF", "LSTM", 2, 1, "lm_adamw_randomk750_seed1.json", RANDOMK),
    ("random-k 1% + EF", "LSTM", 8, 0, "lm_adamw_np8.json", "randomk-ef-adam"),
    ("random-k 1% + EF", "transformer", 2, 0, "lm_adamw_transformer_np2_default750.json", "randomk-ef-adam"),
    ("random-k 1% + EF", "transformer", 2, 1, "lm_adamw_transformer_np2_default750_seed1.json", "randomk-ef-adam"),
    ("PowerSGD rank 4", "LSTM", 2, 0, "lm_adamw_np2_default750.json", "powersgd-adam"),
    ("PowerSGD rank 4", "LSTM", 2, 1, "lm_adamw_np2_default750_seed1.json", "powersgd-adam"),
    ("PowerSGD rank 4", "LSTM", 8, 0, "lm_adamw_np8.json", "powersgd-adam"),
    ("PowerSGD rank 4", "transformer", 2, 0, "lm_adamw_transformer_np2_default750.json", "powersgd-adam"),
    ("PowerSGD rank 4", "transformer", 2, 1, "lm_adamw_transformer_np2_default750_seed1.json", "powersgd-adam"),
    ("PowerSGD rank 4", "transformer", 8, 0, "lm_adamw_transformer_np8.json", POWERSGD),
    ("PowerSGD rank 4", "transformer", 8, 1, "lm_adamw_transformer_np8_seed1.json", "powersgd-adam"),
    ("int8", "LSTM", 2, 0, "lm_adamw.json", "int8"),
    ("int8", "LSTM", 8, 0, "lm_adamw_np8.json", "int8"),
    ("int8", "transformer", 2, 0, "lm_adamw_transformer.json", "int8"),
    ("int8", "transformer", 2, 1, "lm_adamw_transformer_seed1.json", "int8"),
    ("int8", "transformer", 8, 0, "lm_adamw_transformer_np8.json", "int8"),
]
SETTINGS = [("LSTM", 2), ("LSTM", 8), ("transformer", 2), ("transformer", 8)]


def gap(file: str, ranks: int, method: str) -> Optional[float]:
    """The method's final bits/byte minus dense AdamW's (``hvd-dense``) of the same file and
    number of ranks; None where either was not run."""
    path = RESULTS / file
    if not path.exists():
        return None
    runs = json.loads(path.read_text()).get(str(ranks), {})
    if method not in runs or "hvd-dense" not in runs:
        return None
    return runs[method]["final_bpb"] - runs["hvd-dense"]["final_bpb"]


def gaps() -> dict:
    """{(compressor, model, ranks): {seed: gap}} over :data:`RUNS` (runs not there left out)."""
    out: dict = {}
    for compressor, model, ranks, seed, file, method in RUNS:
        value = gap(file, ranks, method)
        if value is not None:
            out.setdefault((compressor, model, ranks), {})[seed] = value
    return out


def table(found: dict) -> str:
    """A markdown table: a row per compressor, a column per model and number of ranks, each cell
    the gaps of seeds 0 / 1, bold where every seed meets the target."""
    lines = ["| compressor (target) | " + " | ".join(f"{m}, {r} ranks" for m, r in SETTINGS) + " |",
             "|---" * (len(SETTINGS) + 1) + "|"]
    for compressor, target in TARGETS.items():
        cells = []
        for model, ranks in SETTINGS:
            seeds = found.get((compressor, model, ranks), {})
            text = " / ".join(f"{seeds[s]:+.3f}" if s in seeds else "-" for s in (0, 1))
            met = seeds and all(g <= target for g in seeds.values())
            cells.append(f"**{text}**" if met else text if seeds else "-")
        lines.append(f"| {compressor} (<= {target}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(found: dict, path: Path) -> None:
    """Each compressor's gaps (a marker per seed) at each setting, with its target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(SETTINGS)
    for i, (model, ranks) in enumerate(SETTINGS):
        for j, compressor in enumerate(TARGETS):
            for seed, value in found.get((compressor, model, ranks), {}).items():
                ax.plot(j + (i - (len(SETTINGS) - 1) / 2) * width, value, "o^"[seed], color=f"C{i}",
                        label=f"{model}, {ranks} ranks" if j == 0 and seed == 0 else None)
    for j, target in enumerate(TARGETS.values()):
        ax.hlines(target, j - 0.45, j + 0.45, colors="gray", linestyles="dashed")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(TARGETS)), list(TARGETS))
    ax.set_ylabel("bits/byte above dense AdamW")
    ax.set_title("FrozenAdam at its defaults (o seed 0, ^ seed 1; dashed: target)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    args = parser.parse_args()
    found = gaps()
    print(table(found))
    if args.plot:
        plot(found, args.plot)


if __name__ == "__main__":
    main()
