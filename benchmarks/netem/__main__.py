"""``python -m benchmarks.netem --np 2 --rate 100mbit [--delay-ms D] [--json F] -- CMD ...``

Runs CMD once per rank in its own namespace on a shaped link (see :mod:`benchmarks.netem.launch`),
prints the bytes that crossed each link and exits with the first failing rank's code.
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
    ap.add_argument("--np", type=int, default=2, help="number of ranks (one namespace each)")
    ap.add_argument("--rate", default="1gbit", help="link rate per rank, e.g. 100mbit, 1gbit, 10gbit")
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
    try:
        result = launch(command, args.np, args.rate, args.delay_ms, timeout=args.timeout)
    except NetemPermissionError as e:
        print(f"netem: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"netem: {e}; ranks killed, network removed", file=sys.stderr)
        return 130
    for rank, b in enumerate(result.link_bytes):
        print(f"netem: rank {rank} sent {b['sent']} B, received {b['received']} B "
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
