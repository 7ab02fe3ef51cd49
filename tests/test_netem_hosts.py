"""The netem launcher's hosts x slots (issue 12.5): 2 emulated hosts of 2 ranks each.

The ranks of one host share a namespace (loopback between them), the hosts are joined by
rate-limited links. Checked: Horovod's placement (local rank / size, cross rank / size from
the launcher's host list), each host's hostname resolving to its own link address, a two-level
exchange (ranks per node from Horovod) equal bit for bit to a numpy reference of the averaged
integer gradients, a two-level DGC run with identical parameters on every rank, traffic inside a
host on the loopback, and nothing left behind. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN), `ip`
and `tc` (CI runs as root): skipped, with the launcher's reason, only where those are missing.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.netem import NetemPermissionError, check_rights, launch, leftovers  # noqa: E402

pytestmark = pytest.mark.horovod
HOSTS, SLOTS = 2, 2
WORKER = ROOT / "tests" / "hvd" / "netem_hosts_worker.py"


def worker_module():
    """The worker's module (for its gradient and constants), imported without running it."""
    spec = importlib.util.spec_from_file_location("netem_hosts_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(WORKER.parent))
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def launched():
    try:
        check_rights()
    except NetemPermissionError as e:
        pytest.skip(f"the netem launcher cannot run here: {e}")
    before = leftovers()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT / 'tests'}:{ROOT}")
    res = launch([sys.executable, str(WORKER)], HOSTS * SLOTS, "100mbit", env=env, timeout=300,
                 echo=False, slots=SLOTS)
    assert res.ok, f"rank {res.failed_rank} failed:\n{res.outputs[res.failed_rank][-6000:]}"
    records = {r["rank"]: r for per_rank in res.results for r in per_rank}
    assert sorted(records) == list(range(HOSTS * SLOTS)), res.outputs
    return res, records, before, leftovers()


def test_placement_host_by_host(launched):
    _, records, _, _ = launched
    for rank, r in records.items():
        assert (r["size"], r["local_size"], r["cross_size"]) == (HOSTS * SLOTS, SLOTS, HOSTS), r
        assert (r["local_rank"], r["cross_rank"]) == (rank % SLOTS, rank // SLOTS), r
    addresses = [records[r]["address"] for r in sorted(records)]
    for rank, address in enumerate(addresses):  # one address per host, distinct between hosts
        assert address.startswith("10.77."), address
        assert address == addresses[rank - rank % SLOTS], addresses
    assert len(set(addresses)) == HOSTS, addresses


def test_two_level_exact_and_identical(launched):
    _, records, _, _ = launched
    w = worker_module()
    size = HOSTS * SLOTS
    expected = -sum(np.mean([w.gradient(r, s) for r in range(size)], axis=0, dtype=np.float64)
                    for s in range(w.STEPS)).astype(np.float32)
    for rank, r in records.items():
        np.testing.assert_array_equal(np.array(r["exact"], np.float32), expected,
                                      err_msg=f"rank {rank}")
        assert r["checksum"] == records[0]["checksum"], f"rank {rank} diverged under two-level DGC"


def test_loopback_inside_a_host_links_between(launched):
    res, records, before, after = launched
    assert res.slots == SLOTS and len(res.link_bytes) == HOSTS
    for rank, r in records.items():
        assert r["lo_bytes"] > 0 and r["eth0_bytes"] > 0, r   # both levels carried traffic
    for link in res.link_bytes:
        assert link["sent"] > 0 and link["received"] > 0, res.link_bytes
    assert after == before, "the launcher left namespaces, links or /etc/netns files behind"


def test_command_line_rejects_a_wrong_layout():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.netem", "--np", "3", "--hosts", "2",
                           "--slots", "2", "--", "true"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "np = hosts x slots" in proc.stderr, proc.stderr
