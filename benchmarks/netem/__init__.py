"""Emulated networks for benchmarks: ranks in network namespaces on rate-limited private links.

    from benchmarks.netem import launch
    result = launch(["python", "train.py"], np=2, rate="100mbit")
    result.link_bytes   # per rank {"sent", "received"}, read from the interface counters
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hvdrun: the rank results

from .launch import LaunchResult, launch, run_ranks
from .links import NetemError, NetemPermissionError, Network, check_rights, leftovers, parse_rate

__all__ = ["LaunchResult", "launch", "run_ranks", "Network", "NetemError", "NetemPermissionError",
           "check_rights", "leftovers", "parse_rate"]
