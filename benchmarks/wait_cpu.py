"""CPU a rank burns while it waits for a slower one: Horovod's ``hvd.synchronize`` against the
engine's polite wait (:mod:`hvdcompress.transport.waiting`), side by side in one launch::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python benchmarks/wait_cpu.py --seconds 5

Rank 0 sleeps ``--seconds`` before each allreduce, so rank 1 waits that long in it: once with
``HVDCOMPRESS_WAIT_PAUSE_US=0`` (the framework's own wait), once at the default cap, then
``--calls`` back-to-back allreduces of one float with neither rank sleeping, for the latency a
pause adds. Rank 1 prints the CPU seconds of each wait and the mean call time.
"""
from __future__ import annotations

import argparse
import os
import time

import horovod.torch as hvd
import torch

from hvdcompress.torch.collectives import HorovodCollectives
from hvdcompress.transport.waiting import DEFAULT_CAP_US, VARIABLE


def one_wait(comm: HorovodCollectives, seconds: float, tag: str) -> tuple:
    """(wall, CPU) seconds of one allreduce that rank 0 enters ``seconds`` late."""
    began, cpu = time.monotonic(), time.process_time()
    if hvd.rank() == 0:
        time.sleep(seconds)
    comm.wait(comm.allreduce([torch.ones(1)], tag))
    return time.monotonic() - began, time.process_time() - cpu


def call_time(comm: HorovodCollectives, calls: int, tag: str) -> float:
    """Mean seconds of a one-float allreduce, neither rank sleeping."""
    began = time.monotonic()
    for i in range(calls):
        comm.wait(comm.allreduce([torch.ones(1)], f"{tag}.{i}"))
    return (time.monotonic() - began) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    hvd.init()
    comm = HorovodCollectives()
    rows = []
    for label, cap in (("hvd.synchronize (spin)", "0"), (f"polite, cap {DEFAULT_CAP_US} us", str(DEFAULT_CAP_US))):
        os.environ[VARIABLE] = cap
        wall, cpu = one_wait(comm, args.seconds, f"wait.{cap}")
        per_call = call_time(comm, args.calls, f"calls.{cap}")
        rows.append((label, wall, cpu, per_call))
    if hvd.rank() == 1:
        print(f"{'wait':28s} {'wall s':>7s} {'CPU s':>7s} {'CPU/wall':>9s} {'1-float allreduce':>18s}")
        for label, wall, cpu, per_call in rows:
            print(f"{label:28s} {wall:7.2f} {cpu:7.2f} {cpu / wall:9.2f} {per_call * 1e6:15.0f} us")


if __name__ == "__main__":
    main()
