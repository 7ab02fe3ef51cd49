"""``python -m benchmarks.netem --np 2 --rate 100mbit [--delay-ms D] [--json F] -- CMD ...``
``python -m benchmarks.netem --hosts 2 --slots 2 --rate 100mbit -- CMD ...``

Runs CMD once per rank: with ``--np N`` each rank in its own namespace on a shaped link; with
``--hosts H --slots S`` H namespaces (emulated hosts) on shaped links, S ranks in each, talking
over the namespace's loopback (see :mod:`benchmarks.netem.launch`). Prints the bytes that
crossed each link and exits with the first failing rank's code.
``--leftovers`` lists namespaces/links/files named hvdc* that a killed launcher left behind.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .launch import Interrupted, launch
from .links import NetemPermissionError, leftovers


def main(argv=None) -> int:
    """Entry point; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.netem", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=None,
                    help="number of ranks (default 2, or hosts x slots); without --hosts one "
                         "namespace each")
    ap.add_argument("--hosts", type=int, default=None, help="emulated hosts (one namespace each)")
    ap.add_argument("--slots", type=int, default=1, help="ranks per host (share its namespace)")
    ap.add_argument("--rate", default="1gbit", help="link rate per host, e.g. 100mbit, 1gbit, 10gbit")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added on each link end")
    ap.add_argument("--timeout", type=float, default=None, help="kill all ranks after this many seconds")
    ap.add_argument("--json", help="write the launch result (codes, outputs, link bytes) here")
    ap.add_argument("--leftovers", action="store_true", help="list hvdc* namespaces/links and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args(argv)
    if args.leftovers:
        print(json.dumps(leftovers(), indent=1))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    hosts = args.hosts if args.hosts is not None else (args.np or 2) // args.slots
    np_ = args.np if args.np is not None else hosts * args.slots
    if hosts < 1 or args.slots < 1 or np_ != hosts * args.slots:
        ap.error(f"--np {args.np} --hosts {args.hosts} --slots {args.slots}: allowed: hosts >= 1, "
                 "slots >= 1 and np = hosts x slots")
    try:
        result = launch(command, np_, args.rate, args.delay_ms, timeout=args.timeout,
                        slots=args.slots)
    except NetemPermissionError as e:
        print(f"netem: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"netem: {e}; ranks killed, network removed", file=sys.stderr)
        return 130
    who = "host" if args.slots > 1 else "rank"
    for i, b in enumerate(result.link_bytes):
        print(f"netem: {who} {i} sent {b['sent']} B, received {b['received']} B "
              f"at {args.rate} in {result.seconds:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(result), f, indent=1)
    if not result.ok:
        code = result.returncodes[result.failed_rank]
        print(f"netem: rank {result.failed_rank} failed (exit code {code})", file=sys.stderr)
        return code if code else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
