"""Emulated networks for benchmarks: ranks in network namespaces on rate-limited private links.

    from benchmarks.netem import launch
    result = launch(["python", "train.py"], np=2, rate="100mbit")
    result.link_bytes   # per rank {"sent", "received"}, read from the interface counters
"""
from .launch import LaunchResult, launch, run_ranks
from .links import Network, NetemError, NetemPermissionError, check_rights, leftovers, parse_rate

__all__ = ["LaunchResult", "launch", "run_ranks", "Network", "NetemError", "NetemPermissionError",
           "check_rights", "leftovers", "parse_rate"]
