"""benchmarks/diloco.py's time to the same loss: the training clock leaves the evaluations out
(convergence.TimedCurve, on a fake clock) and the seconds to a target are read off the curve,
linear between the two points around it (numbers worked out by hand here)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import convergence  # noqa: E402
import diloco  # noqa: E402


def test_the_clock_leaves_the_evaluations_out(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(convergence.time, "perf_counter", lambda: now[0])
    values = iter([3.0, 2.5, 2.0])

    def evaluate():
        now[0] += 10.0            # every evaluation takes 10 s
        return next(values)

    curve = convergence.TimedCurve(evaluate)
    now[0] += 4.0                 # 4 s of training
    curve.record(50)
    now[0] += 6.0                 # 6 s more
    curve.record(100)
    assert curve.points == [(0, 3.0), (50, 2.5), (100, 2.0)]
    assert curve.times == [0.0, 4.0, 10.0]


@pytest.mark.parametrize("target,expected", [
    (3.0, 0.0),        # reached at the start
    (2.75, 2.0),       # halfway from 3.0 (0 s) to 2.5 (4 s)
    (2.5, 4.0),
    (2.2, 7.6),        # 3/5 of the way from 2.5 (4 s) to 2.0 (10 s)
    (1.9, None),       # never
])
def test_seconds_to_a_target_are_linear_between_points(target, expected):
    times, curve = [0.0, 4.0, 10.0], [(0, 3.0), (50, 2.5), (100, 2.0)]
    got = diloco.seconds_to(times, curve, target)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_a_curve_that_rises_again_counts_its_first_crossing():
    assert diloco.seconds_to([0.0, 1.0, 2.0, 3.0], [(0, 3.0), (1, 2.0), (2, 2.6), (3, 1.0)], 2.5) == \
        pytest.approx(0.5)
