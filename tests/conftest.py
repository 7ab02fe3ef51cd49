"""Shared test helpers.

Multi-process tests run a script from tests/hvd/ under real Horovod processes::

    out = run_horovod("torch_identical_params.py", np=2, args=["--steps", "5"])

The script prints ``RESULT <json>`` lines; ``run_horovod`` returns them parsed, one list per rank
order of appearance, and fails the test with the full output when horovodrun fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
HVD_SCRIPTS = HERE / "hvd"


def pytest_configure(config):
    config.addinivalue_line("markers", "horovod: runs real Horovod processes under horovodrun")


def run_horovod(script: str, np: int = 2, args=(), timeout: int = 300, env=None) -> list:
    """Run tests/hvd/<script> under ``horovodrun -np N --gloo``; return its RESULT payloads."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           sys.executable, str(HVD_SCRIPTS / script), *map(str, args)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(HERE.parent))
    full_env.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"horovodrun {script} failed ({proc.returncode}):\n{output[-6000:]}")
    results = []
    for line in output.splitlines():
        marker = line.find("RESULT ")
        if marker >= 0:
            results.append(json.loads(line[marker + len("RESULT "):]))
    assert results, f"{script} printed no RESULT line:\n{output[-4000:]}"
    return results


def run_horovod_failing(script: str, np: int = 2, args=(), timeout: int = 120) -> str:
    """Run a script that is expected to fail; return its output (the test asserts on it)."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           sys.executable, str(HVD_SCRIPTS / script), *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode != 0, "expected the run to fail"
    return proc.stdout + proc.stderr
