"""Run Horovod (Gloo) ranks on H emulated hosts of S slots: one network namespace per host on a
shaped private link, the S ranks of a host inside its namespace (see :mod:`.links`).

The launcher plays horovodrun's part with horovodrun's own public pieces: it starts
:class:`horovod.runner.http.http_server.RendezvousServer` in the host namespace (on the bridge
address the ranks can reach), plans the slots with ``get_host_assignments`` over the host list
``hvdcP-host0:S,hvdcP-host1:S,...`` (as ``horovodrun -H`` would: ranks placed host by host, so
each rank gets its local rank / size and cross rank / size, and its host's rendezvous scopes)
and builds each rank's environment with ``create_run_env_vars`` / ``create_slot_env_vars``,
binding Gloo to the namespace's ``eth0``. The same environment carries MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE and GLOO_SOCKET_IFNAME, so a script may use ``torch.distributed`` (Gloo) on the
same links instead.

Whatever happens (a rank fails, a timeout, SIGINT/SIGTERM/SIGHUP), the other ranks are killed
and every namespace, link and file is removed before the launcher returns or exits.

Command line (as root, from the repository root)::

    python -m benchmarks.netem --np 2 --rate 100mbit [--delay-ms 1] [--json out.json] -- \\
        python train.py ...
    python -m benchmarks.netem --hosts 2 --slots 2 --rate 100mbit -- python train.py ...
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer
from hvdrun import RESULTS_ENV, read_results

from .links import CLEANUP_SIGNALS, RANK_IFACE, Network

TORCH_DIST_PORT = 29500
KILL_GRACE_S = 5.0


@dataclass
class LaunchResult:
    """What a launch produced: exit codes, each rank's output and the records it wrote with
    ``hvdrun.write_result`` (``results[r]``), the bytes that crossed each host's
    link (``link_bytes[h]``; one per rank on a flat network)."""

    returncodes: list
    outputs: list
    results: list
    link_bytes: list
    seconds: float
    rate_bps: int
    delay_ms: float
    failed_rank: Optional[int] = None
    slots: int = 1

    @property
    def ok(self) -> bool:
        return self.failed_rank is None and all(rc == 0 for rc in self.returncodes)


class Interrupted(Exception):
    """The launcher got a termination signal."""


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into :class:`Interrupted` so ``finally`` blocks run."""
    def handler(signum, _frame):
        raise Interrupted(f"got signal {signal.Signals(signum).name}")
    previous = {s: signal.signal(s, handler) for s in CLEANUP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def rank_env(net: Network, slot, port: int, base: dict) -> dict:
    """The environment of one rank: Horovod's Gloo rendezvous variables plus torch.distributed's."""
    env = dict(base)
    env.update({k: str(v) for k, v in create_run_env_vars(net.gateway, [RANK_IFACE], port).items()})
    env.update(create_slot_env_vars(slot))
    env.update({"MASTER_ADDR": net.links[0].address, "MASTER_PORT": str(TORCH_DIST_PORT),
                "RANK": str(slot.rank), "WORLD_SIZE": str(slot.size),
                "LOCAL_RANK": str(slot.local_rank), "GLOO_SOCKET_IFNAME": RANK_IFACE,
                "PYTHONUNBUFFERED": "1"})
    return env


def _pump(rank: int, stream, sink: list, echo: bool) -> None:
    for line in stream:
        sink.append(line)
        if echo:
            sys.stdout.write(f"[{rank}] {line}")
            sys.stdout.flush()


def _kill_all(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _wait(procs: Sequence[subprocess.Popen], timeout: Optional[float]) -> Optional[int]:
    """Wait for all ranks; return the first rank that failed (or timed out), else None."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return bad[0]
        if all(c == 0 for c in codes):
            return None
        if deadline is not None and time.monotonic() > deadline:
            return next(r for r, c in enumerate(codes) if c is None)
        time.sleep(0.05)


def run_ranks(net: Network, command: Sequence[str], env: Optional[dict] = None,
              timeout: Optional[float] = None, echo: bool = True) -> LaunchResult:
    """Run ``command`` once per rank inside ``net``'s namespaces; return when all have exited.

    When a rank fails or ``timeout`` passes, the others are killed; the result says which rank.
    Each rank's ``hvdrun.write_result`` records go to a fresh directory named
    by ``hvdrun.RESULTS_ENV`` (the namespaces share the file system).
    """
    with tempfile.TemporaryDirectory(prefix="hvdc-results-") as results_dir:
        return _run_ranks(net, command, {**(env or os.environ), RESULTS_ENV: results_dir},
                          timeout, echo, results_dir)


def _run_ranks(net: Network, command: Sequence[str], env: dict, timeout: Optional[float],
               echo: bool, results_dir: str) -> LaunchResult:
    rendezvous = RendezvousServer()
    port = rendezvous.start()
    slots = get_host_assignments(
        parse_hosts(",".join(f"{l.hostname}:{net.slots}" for l in net.links)), net.ranks)
    link_of = {l.hostname: l for l in net.links}
    rendezvous.init(slots)
    procs: list = []
    outputs: list = [[] for _ in slots]
    pumps = []
    before = net.counters()
    start = time.monotonic()
    try:
        for slot in slots:
            p = subprocess.Popen(["ip", "netns", "exec", link_of[slot.hostname].netns, *command],
                                 env=rank_env(net, slot, port, env),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(slot.rank, p.stdout, outputs[slot.rank], echo),
                                 daemon=True)
            t.start()
            pumps.append(t)
        failed = _wait(procs, timeout)
    finally:
        _kill_all(procs)
        rendezvous.stop()
    for t in pumps:
        t.join(timeout=2)
    after = net.counters()
    link_bytes = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    return LaunchResult([p.returncode for p in procs], ["".join(o) for o in outputs],
                        read_results(results_dir, net.ranks), link_bytes,
                        time.monotonic() - start, net.rate_bps, net.delay_ms, failed, net.slots)


def launch(command: Sequence[str], np: int, rate: str, delay_ms: float = 0.0,
           env: Optional[dict] = None, timeout: Optional[float] = None,
           echo: bool = True, slots: int = 1) -> LaunchResult:
    """Build the network of np / ``slots`` hosts with ``slots`` ranks each (the flat network of
    ``np`` ranks by default), run the ``np`` ranks, tear everything down (even on failure or a
    signal)."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1 or np % slots:
        raise ValueError(f"slots={slots!r} with np={np}: allowed: an int >= 1 that divides np")
    with signals_raise(), Network(np // slots, rate, delay_ms, slots=slots) as net:
        return run_ranks(net, command, env=env, timeout=timeout, echo=echo)
