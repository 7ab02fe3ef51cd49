"""benchmarks/v_drift.py: the drift is sum |after - before| / sum after (a numpy reference), taken
every 16 steps of dense AdamW on a task of adamw_summary's sets, with that task's flags."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import v_drift  # noqa: E402


def test_relative_drift_is_the_l1_change_over_the_l1_size():
    rng = np.random.default_rng(3)
    before, after = rng.random(100), rng.random(100)
    expected = np.abs(after - before).sum() / after.sum()
    got = v_drift.relative_drift(torch.from_numpy(before), torch.from_numpy(after))
    assert got == pytest.approx(expected, rel=1e-12)
    assert v_drift.relative_drift(torch.from_numpy(after), torch.from_numpy(after)) == 0.0


def test_task_args_carry_the_sets_flags():
    args = v_drift.task_args("validation", "lstm256", "0.999", 1)
    assert (args.hidden, args.batch, args.corpus, args.betas, args.seed) == (256, 32, "python-docs", "0.9,0.999", 1)
    assert v_drift.task_args("tuning", "lstm-constant", "0.95", 0).schedule == "constant"


def test_drifts_every_window_of_a_short_run_fall_as_v_averages_more_steps():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        found = v_drift.drifts(v_drift.task_args("tuning", "lstm", "0.999", 0), ranks=1, steps=80)
    finally:
        torch.set_num_threads(threads)
    assert [t for t, _ in found] == [32, 48, 64, 80]
    assert all(d > 0.0 for _, d in found)
    assert found[-1][1] < found[0][1]   # at b2 0.999 v_hat averages ever more squares
