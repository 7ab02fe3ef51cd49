"""benchmarks/adamw_summary.py: a cell is the mean over its seeds with half their range, the
smallest bytes ratio, and meets its target when the mean does (numbers worked out by hand);
the launch's command carries its set's task flags and the DDP hook's method keys."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import adamw_summary as summary  # noqa: E402


def launch(path: Path, ranks: int, dense: float, methods: dict) -> None:
    runs = {"hvd-dense": {"final_bpb": dense}}
    runs.update({k: {"final_bpb": bpb, "bytes": {"ratio": ratio}} for k, (bpb, ratio) in methods.items()})
    path.write_text(json.dumps({str(ranks): runs}))


def test_a_cell_is_the_seeds_mean_and_meets_when_the_mean_does(tmp_path, monkeypatch):
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    # seed 0: onebit +0.010 at 12x, top-k +0.080 at 11x; seed 1: onebit +0.040 at 11.5x, top-k +0.040 at 10.5x
    launch(summary.result_file("validation", "lstm256", 2, "0.95", 0), 2, 2.5,
           {"onebit-ef-adam": (2.51, 12.0), "topk-ef-adam": (2.58, 11.0)})
    launch(summary.result_file("validation", "lstm256", 2, "0.95", 1), 2, 2.6,
           {"onebit-ef-adam": (2.64, 11.5), "topk-ef-adam": (2.64, 10.5)})
    found = summary.gaps("validation")
    onebit = found[("onebit + EF", "lstm256", 2, "0.95")]
    assert abs(onebit[0][0] - 0.010) < 1e-9 and abs(onebit[1][0] - 0.040) < 1e-9
    text, met = summary.cell("onebit + EF", onebit)
    assert text == "**+0.025 ± 0.015 (11.5x, 2)**" and met          # mean 0.025 <= 0.03
    text, met = summary.cell("top-k 1% + EF", found[("top-k 1% + EF", "lstm256", 2, "0.95")])
    assert text == "+0.060 ± 0.020 (10.5x, 2)" and not met          # mean 0.060 > 0.05
    table = summary.table("validation", found).splitlines()
    assert len(table) == 2 + len(summary.TARGETS) and "LSTM 256" in table[0]
    assert table[-1].endswith("| - |")                               # int8 not run


def test_too_few_bytes_saved_misses_the_cell_but_for_int8():
    assert not summary.cell("onebit + EF", {0: (0.0, 9.9)})[1]
    assert summary.cell("int8", {0: (0.005, 4.0)})[1]
    assert not summary.cell("int8", {0: (0.02, 4.0)})[1]


def test_the_launch_command_carries_the_task_and_the_front_end():
    cmd = summary.command("validation", "transformer-ddp", 8, "0.999", 1)
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--corpus"] == "python-docs" and flags["--clip"] == "1.0" and flags["--nps"] == "8"
    assert flags["--betas"] == "0.9,0.999" and flags["--seed"] == "1"
    assert flags["--methods"].split(",") == ["hvd-dense"] + [f"ddp:{m}" for m in summary.METHODS.values()]
    assert flags["--json"].endswith("adamw_validation_transformer-ddp_b0999_np8_s1.json")


def test_only_the_constant_lr_task_drops_the_cosine_schedule():
    schedules = {name: dict(zip(cmd, cmd[1:])).get("--schedule", "cosine")
                 for name in summary.VALIDATION
                 for cmd in [summary.command("validation", name, 2, "0.95", 0)]}
    assert schedules == {"lstm256": "cosine", "transformer-ddp": "cosine", "lstm256-constant": "constant"}
    assert "--schedule" not in summary.command("tuning", "lstm", 2, "0.95", 0)
    tuning = summary.command("tuning", "lstm-constant", 2, "0.95", 0)
    assert dict(zip(tuning, tuning[1:]))["--schedule"] == "constant"
    # the same LSTM as the tuning set's cosine task, the schedule aside
    plain = summary.TUNING["lstm"].flags
    assert summary.TUNING["lstm-constant"].flags == plain + ("--schedule", "constant")
