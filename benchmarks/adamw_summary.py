"""The Adam take-over at today's defaults, in one table and one plot (benchmarks/README.md
section 8): validation bits/byte against dense AdamW in the same launch, and the gradient bytes
over the whole run (warm-up included: dense bytes / sent bytes of one rank), for each compressor,
on both language models (LSTM, causal transformer), at 2 and 8 ranks, for AdamW's betas
(0.9, 0.95) and (0.9, 0.999), per seed, over 1,000 steps and (one column per model) 3,000.

    .venv/bin/python benchmarks/adamw_summary.py [--plot benchmarks/results/adamw_summary.png]
    .venv/bin/python benchmarks/adamw_summary.py --issue 20    # the former defaults (freeze at 750)

The runs are the ones listed in :data:`RUNS` (issue 36's defaults: FrozenAdam's variance
schedule, int8 v-steps, no ``freeze_steps``) or :data:`RUNS_20` (issue 20's: a fixed freeze at
750 steps, dense warm-up, betas (0.9, 0.999)), each a result of ``benchmarks/convergence.py``
(the JSON file, the number of ranks, the method's key in it). A run not there yet reads "-".
A cell is bold where every seed meets the gap target and, for issue 36, >= 10x fewer bytes
(int8 cannot: 4x at most; its cell needs the gap only).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).resolve().parent / "results"

#: compressor -> its gap target (bits/byte above dense AdamW)
TARGETS = {"onebit + EF": 0.03, "top-k 1% + EF": 0.05, "random-k 1% + EF": 0.05,
           "PowerSGD rank 4": 0.05, "int8": 0.01}
ONEBIT, TOPK, RANDOMK = ("onebit:ef=vanilla:adam=frozen:freeze_steps=750",
                         "topk:k=0.01:ef=vanilla:adam=frozen:freeze_steps=750",
                         "randomk:k=0.01:ef=vanilla:adam=frozen:freeze_steps=750")
POWERSGD = "powersgd:rank=4:adam=frozen:freeze_steps=750"

#: bytes target over the whole run (dense / sent), issue 36; int8 is 4x at most
BYTES_TARGET = 10.0

#: the table's columns: (model, ranks, betas, steps)
SETTINGS = [(m, r, b, 1000) for m in ("LSTM", "transformer") for r in (2, 8) for b in ("0.95", "0.999")] + [
    (m, 2, "0.95", 3000) for m in ("LSTM", "transformer")]


def result_file(model: str, ranks: int, betas: str, steps: int) -> str:
    """Issue 36's launch at today's defaults for a column: ``lm_adamw_i36_<model>_b<b2>_np<N>[_3000]_lr.json``
    (``_lr``: the compressed steps' lr units, adam.py). A record with a ``launch`` key was carried
    from that earlier launch (before the lr units; dense AdamW, which they do not touch, or a
    method not run again), named in benchmarks/README.md section 8."""
    b2 = betas.replace(".", "")
    return f"lm_adamw_i36_{model.lower()}_b{b2}_np{ranks}{'_3000' if steps != 1000 else ''}_lr.json"


METHODS = [("onebit + EF", "onebit-ef-adam"), ("top-k 1% + EF", "topk-ef-adam"),
           ("PowerSGD rank 4", "powersgd-adam"), ("int8", "int8-adam")]

#: (compressor, model, ranks, betas, steps, seed, file, method)
RUNS = [(name, model, ranks, betas, steps, 0, result_file(model, ranks, betas, steps), method)
        for model, ranks, betas, steps in SETTINGS for name, method in METHODS]

#: issue 20's runs at its defaults, betas (0.9, 0.999) (the aliases onebit-ef-adam, topk-ef-adam,
#: randomk-ef-adam and powersgd-adam where run after their default became 750)
RUNS_20 = [
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
SETTINGS_20 = [("LSTM", 2), ("LSTM", 8), ("transformer", 2), ("transformer", 8)]


def gap(file: str, ranks: int, method: str) -> Optional[tuple]:
    """(the method's final bits/byte minus dense AdamW's (``hvd-dense``) of the same file and
    number of ranks, the method's dense/sent bytes over the whole run, whether the method's record
    was carried from an earlier launch); None where either was not run."""
    path = RESULTS / file
    if not path.exists():
        return None
    runs = json.loads(path.read_text()).get(str(ranks), {})
    if method not in runs or "hvd-dense" not in runs:
        return None
    sent = runs[method].get("bytes") or {}
    return runs[method]["final_bpb"] - runs["hvd-dense"]["final_bpb"], sent.get("ratio", 1.0), "launch" in runs[method]


def gaps(issue: int = 36) -> dict:
    """{(compressor, model, ranks, betas, steps): {seed: (gap, ratio)}} over the runs (those
    not there left out)."""
    out: dict = {}
    runs = RUNS if issue == 36 else [(c, m, r, "0.999", 1000, s, f, k) for c, m, r, s, f, k in RUNS_20]
    for compressor, model, ranks, betas, steps, seed, file, method in runs:
        value = gap(file, ranks, method)
        if value is not None:
            out.setdefault((compressor, model, ranks, betas, steps), {})[seed] = value
    return out


def settings_of(issue: int) -> list:
    """The table's columns, (model, ranks, betas, steps)."""
    return SETTINGS if issue == 36 else [(m, r, "0.999", 1000) for m, r in SETTINGS_20]


def label(model: str, ranks: int, betas: str, steps: int) -> str:
    return f"{model}, {ranks} ranks, b2 {betas}" + (f", {steps:,} steps" if steps != 1000 else "")


def table(found: dict, issue: int = 36, run_only: bool = False) -> str:
    """A markdown table: a row per compressor, a column per model, number of ranks and b2, each
    cell the gaps of seeds 0 / 1 with the whole run's bytes ratio, bold where every seed meets
    the targets; † where the method's record came from an earlier launch (:func:`result_file`)."""
    settings = settings_of(issue)
    if run_only:   # only the columns with a run
        settings = [x for x in settings if any(k[1:] == x for k in found)]
    lines = ["| compressor (target) | " + " | ".join(label(*x) for x in settings) + " |",
             "|---" * (len(settings) + 1) + "|"]
    for compressor, target in TARGETS.items():
        if run_only and not any(k[0] == compressor for k in found):
            continue
        cells = []
        for setting in settings:
            seeds = found.get((compressor, *setting), {})
            text = " / ".join(f"{seeds[s][0]:+.3f} ({seeds[s][1]:.1f}x){'†' if seeds[s][2] else ''}"
                              if s in seeds else "-" for s in (0, 1) if s == 0 or s in seeds)
            enough = lambda ratio: issue != 36 or compressor == "int8" or ratio >= BYTES_TARGET
            met = seeds and all(g <= target and enough(r) for g, r, _ in seeds.values())
            cells.append(f"**{text}**" if met else text if seeds else "-")
        lines.append(f"| {compressor} (<= {target}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(found: dict, path: Path, issue: int = 36) -> None:
    """Each compressor's gaps (a marker per seed) at each setting, with its target."""
    settings = settings_of(issue)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(settings)
    for i, setting in enumerate(settings):
        for j, compressor in enumerate(TARGETS):
            for seed, (value, _, _) in found.get((compressor, *setting), {}).items():
                ax.plot(j + (i - (len(settings) - 1) / 2) * width, value, "o^"[seed], color=f"C{i}",
                        label=label(*setting) if seed == 0 else None)
    for j, target in enumerate(TARGETS.values()):
        ax.hlines(target, j - 0.45, j + 0.45, colors="gray", linestyles="dashed")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(TARGETS)), list(TARGETS))
    ax.set_ylabel("bits/byte above dense AdamW")
    ax.set_title(f"FrozenAdam at issue {issue}'s defaults (o seed 0, ^ seed 1; dashed: target)")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(dict(zip(labels, handles)).values(), dict(zip(labels, handles)).keys(), fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    parser.add_argument("--issue", type=int, choices=(20, 36), default=36,
                        help="36: today's defaults (both betas, bytes); 20: the fixed freeze at 750")
    parser.add_argument("--run-only", action="store_true", help="only the rows and columns with a run")
    args = parser.parse_args()
    found = gaps(args.issue)
    print(table(found, args.issue, args.run_only))
    if args.plot:
        plot(found, args.plot, args.issue)


if __name__ == "__main__":
    main()
