"""Shared test helpers.

Multi-process tests run a script from tests/hvd/ under real Horovod processes::

    out = run_horovod("torch_identical_params.py", np=2, args=["--steps", "5"])

The script reports with ``common.result(rank, **values)``, which appends one JSON record to its
rank's own file (``examples/hvdrun.py``); ``run_horovod`` returns every record, ordered by rank
then by the order each rank wrote them, and fails the test with each rank's stderr tail when
horovodrun fails or runs past ``timeout``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def _import_triton_first() -> None:
    """Import triton before anything imports horovod.tensorflow: a process that imports
    horovod.tensorflow (0.28.1) and then triton (3.9.0) aborts at exit with "free(): invalid
    pointer", which fails the whole pytest run after every test passed; the other order exits
    cleanly. TRITON_INTERPRET=1 while importing, as tests/test_triton_kernels.py needs (triton
    reads it at import), then restored."""
    if importlib.util.find_spec("triton") is None:
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


_import_triton_first()

HERE = Path(__file__).parent
HVD_SCRIPTS = HERE / "hvd"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "examples"))  # hvdrun: the launcher

import zygote  # noqa: E402
from hvdrun import RESULTS_ENV, LaunchError, read_results, run_script, start_horovodrun  # noqa: E402

# Repository root on the ranks' path; TensorFlow's C++ INFO/WARNING lines out of the stderr tails.
RANK_ENV = {"PYTHONPATH": str(HERE.parent), "TF_CPP_MIN_LOG_LEVEL": "2"}
# horovodrun from a fork server (examples/hvdrun.py start_horovodrun): 3-4 s less per launch
os.environ.setdefault("HVDRUN_FORK", "1")
# ranks forked from a server that imported their framework once (tests/zygote.py): ~5 s of CPU less per rank
os.environ.setdefault(zygote.ENABLE, "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "horovod: runs real Horovod processes under horovodrun")


LAUNCHERS = ("run_horovod(", "run_scripts(", "torchrun(", "run_cases(", "launch_elastic(", "run_elastic(")


def pytest_collection_modifyitems(session, config, items):
    """The files that launch processes first, the most launches first (a stable sort, the same
    on every xdist worker): under ``--dist loadfile`` the long files then start at once instead
    of leaving one worker alone with the last of them."""
    weight: dict = {}

    def launches(item) -> int:
        path = Path(str(item.fspath))
        if path not in weight:
            text = path.read_text()
            weight[path] = sum(text.count(name) for name in LAUNCHERS)
        return weight[path]

    items.sort(key=lambda item: -launches(item))


def _run_script(script: str, np: int, args, timeout: int, env) -> Any:
    """:func:`hvdrun.run_script` of tests/hvd/<script> (or a path), its ranks from tests/zygote.py."""
    argv, env = zygote.command(HVD_SCRIPTS / script, list(args), {**RANK_ENV, **(env or {})})
    return run_script(argv[0], np=np, args=argv[1:], timeout=timeout, env=env)


def run_horovod(script: str, np: int = 2, args=(), timeout: int = 300, env=None) -> list:
    """Run tests/hvd/<script> (or a path) under ``horovodrun -np N --gloo``; return its records
    (each a dict with ``rank``)."""
    try:
        launch = _run_script(script, np, args, timeout, env)
    except LaunchError as e:
        pytest.fail(str(e), pytrace=False)
    records = launch.records
    assert records, f"{script} reported no result:\n{launch.log[-4000:]}"
    return records


def run_scripts(runs, np: int = 2, timeout: int = 600, env=None) -> dict:
    """Several tests/hvd scripts in one launch (tests/hvd/torch_scripts.py): ``runs`` holds
    ``(label, script, args, env)``; returns each label's records (``script`` removed)."""
    out: dict = {label: [] for label, *_ in runs}
    for r in run_horovod("torch_scripts.py", np=np, timeout=timeout, env=env,
                         args=[json.dumps([list(run) for run in runs])]):
        out[r.pop("script")].append(r)
    return out


def launch_elastic(work: Path, command: list, discovery: Path, timeout: int, during=None) -> list:
    """Every record of one elastic launch of ``command`` (rank files 0..3 under
    ``work/results``): 2 ranks that may grow to 4, through the host discovery script
    ``discovery``, which reads ``work/hosts`` (starting at ``localhost:2``; named in the ranks'
    $HVDCOMPRESS_HOSTS). ``during(results, hosts)`` is called every
    half second while the launch runs. The test fails with horovodrun's output on a non-zero
    exit or after ``timeout`` seconds, when the process group is killed: then with each rank's
    last record and the stacks every rank printed 20 s before
    (tests/hvd/common.dump_stacks_before_kill). ``--network-interface lo``: without it an
    elastic horovodrun waits for a second host to find common network interfaces."""
    hosts, results = work / "hosts", work / "results"
    results.mkdir()
    hosts.write_text("localhost:2\n")
    # Gloo's rendezvous waits 30 s by default: two elastic launches at once on 2 loaded cores
    # miss it at a reset ("Wait timeout after 30 seconds for key(s)"), so it is given 120 s
    env = {**os.environ, **RANK_ENV, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
           RESULTS_ENV: str(results), "HVDCOMPRESS_HOSTS": str(hosts),
           zygote.STACKS_AT_ENV: str(time.time() + timeout - 20)}
    if command[0] == sys.executable:   # the ranks forked from a server (tests/zygote.py)
        argv, env = zygote.command(command[1], command[2:], env)
        command = [sys.executable, *argv]
    cmd = ["-np", "2", "--min-np", "2", "--max-np", "4",
           "--network-interface", "lo", "--host-discovery-script", str(discovery), *command]
    log = work / "horovodrun.log"
    proc, deadline = start_horovodrun(cmd, env, log), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if during is not None:
            during(results, hosts)
        time.sleep(0.5)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        last = {path.name: (path.read_text().splitlines() or ["(none)"])[-1] for path in sorted(results.glob("rank*"))}
        pytest.fail(f"elastic launch timed out after {timeout} s; each rank's last record: {last}\n"
                    f"{log.read_text()[-12000:]}")
    if proc.returncode != 0:
        pytest.fail(f"elastic launch failed ({proc.returncode}):\n{log.read_text()[-4000:]}")
    return [rec for per_rank in read_results(results, 4) for rec in per_rank]


def run_elastic(work: Path, script: Path, timeout: int) -> list:
    """:func:`launch_elastic` of the worker ``script`` (which writes the hosts file itself,
    tests/hvd/common.wait_for_world) with tests/hvd/elastic_discovery.sh, which misses every host
    once on the way to 3 ranks; fails if it never did."""
    records = launch_elastic(work, [sys.executable, str(script), str(work)],
                             HVD_SCRIPTS / "elastic_discovery.sh", timeout)
    assert (work / "hosts.missed").is_dir(), \
        "tests/hvd/elastic_discovery.sh never answered no host: the launch did not test a missed discovery"
    return records


def run_horovod_failing(script: str, np: int = 2, args=(), timeout: int = 120, env=None) -> str:
    """Run a script that is expected to fail; return every rank's output (the test asserts on
    it). A time-out is not the expected failure: it fails the test."""
    try:
        _run_script(script, np, args, timeout, env)
    except LaunchError as e:
        if e.timed_out:
            pytest.fail(str(e), pytrace=False)
        return e.combined_output
    pytest.fail(f"expected horovodrun {script} to fail, but it exited with 0")
