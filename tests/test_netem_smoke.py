"""Smoke test of the netem launcher: 2 ranks in namespaces on a 1 Gbit/s link, a tiny model.

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN), `ip` and `tc`: CI runs as root. Without them the
test fails with the launcher's message; it is never skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.netem import NetemPermissionError, check_rights, leftovers  # noqa: E402

pytestmark = pytest.mark.horovod
STEPS, WIDTH = 3, 256


def test_launcher_runs_measures_and_cleans_up(tmp_path):
    try:
        check_rights()
    except NetemPermissionError as e:
        pytest.fail(f"the netem launcher cannot run here: {e}")
    before = leftovers()
    report = tmp_path / "launch.json"
    cmd = [sys.executable, "-m", "benchmarks.netem", "--np", "2", "--rate", "1gbit",
           "--timeout", "240", "--json", str(report), "--", sys.executable,
           str(ROOT / "tests" / "hvd" / "netem_smoke_worker.py"), "--steps", str(STEPS),
           "--width", str(WIDTH)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"launcher failed ({proc.returncode}):\n{output[-6000:]}"

    launch = json.loads(report.read_text())
    results = [r for per_rank in launch["results"] for r in per_rank]
    assert sorted(r["rank"] for r in results) == [0, 1], output[-4000:]
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"]), "ranks diverged"
    for r in results:
        # 2 ranks: a ring allreduce sends each rank's whole payload once; the interface also
        # carries TCP/IP headers, ACKs and Horovod's control messages, but not several times more.
        assert r["wire_sent"] > 0
        assert 0.9 * r["accounted"] <= r["wire_sent"] <= 3 * r["accounted"] + 200_000, r
    for rank, link in enumerate(launch["link_bytes"]):
        sent = next(r["wire_sent"] for r in results if r["rank"] == rank)
        assert link["sent"] >= sent, (rank, link, sent)  # the host end saw what the rank counted
        assert link["received"] > 0
    assert leftovers() == before, "the launcher left namespaces, links or /etc/netns files behind"
