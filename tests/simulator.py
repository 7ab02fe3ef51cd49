"""An in-process simulator of P ranks for the exchange engine (hvdcompress.engines.exchange): the
collectives adapter of the tests (several process sets: :func:`run_nodes`). Each rank runs in its own thread; every collective call
contributes the rank's tensors, waits for the other ranks at a barrier, and returns what
Horovod would (sum, rank-order concatenation, all-to-all of equal parts).

``threads``: the torch threads each simulated rank computes on (its own
``torch.set_num_threads``, which pins OpenMP and MKL for the calling thread; the process's
setting is restored after). A reference compared bit for bit with launched ranks must compute
as they do: a matmul's or a large reduction's bits can depend on the thread count, differently
on each CPU (tests/test_ddp.py: the ranks run on one)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from hvdcompress.transport.collectives import Collectives


class World:
    """Shared by the P simulated ranks; ``timeout`` bounds every wait (a hang is a failure)."""

    def __init__(self, size: int, timeout: float = 60.0):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: dict = {}
        self.lock = threading.Lock()

    def exchange(self, rank: int, call: int, tensors: list) -> list:
        """Every rank's ``tensors`` for the ``call``-th collective, in rank order."""
        with self.lock:
            self.slots.setdefault(call, {})[rank] = [t.clone() for t in tensors]
        self.barrier.wait()
        everyone = [self.slots[call][r] for r in range(self.size)]
        self.barrier.wait()
        return everyone


class SimulatedCollectives(Collectives):
    def __init__(self, world: World, rank: int):
        self.shared, self.rank, self.world = world, rank, world.size
        self.calls = 0
        self.log: list = []   # (collective, tag, [numel]) of every call

    def _all(self, tensors: list, collective: str, tag: str) -> list:
        self.calls += 1
        self.log.append((collective, tag, [t.numel() for t in tensors]))
        return self.shared.exchange(self.rank, self.calls, tensors)

    def allreduce(self, tensors: list, tag: str) -> list:
        everyone = self._all(tensors, "allreduce", tag)
        out = []
        for i in range(len(tensors)):
            total = everyone[0][i].clone()
            for r in range(1, self.world):
                total += everyone[r][i]
            out.append(total)
        return out

    def allgather(self, tensors: list, tag: str) -> list:
        everyone = self._all(tensors, "allgather", tag)
        return [torch.cat([everyone[r][i] for r in range(self.world)]) for i in range(len(tensors))]

    def alltoall(self, tensors: list, tag: str) -> list:
        everyone = self._all(tensors, "alltoall", tag)
        return [torch.cat([everyone[r][i].chunk(self.world)[self.rank] for r in range(self.world)])
                for i in range(len(tensors))]

    def wait(self, handle: Any) -> list:
        return handle


def run_ranks(size: int, body: Callable[[SimulatedCollectives], Any], timeout: float = 60.0,
              threads: Optional[int] = None) -> list:
    """``body(comm)`` on ``size`` simulated ranks in threads (each on ``threads`` torch threads
    if given); their results in rank order."""
    world = World(size, timeout)
    return _run_threads(size, [world], lambda rank: body(SimulatedCollectives(world, rank)), timeout, threads)


def run_nodes(nodes: int, per_node: int, body: Callable[..., Any], timeout: float = 60.0,
              threads: Optional[int] = None) -> list:
    """``body(world_comm, node_comm, cross_comm)`` on ``nodes`` x ``per_node`` simulated ranks
    (rank r on node r // per_node with local rank r % per_node, as horovodrun places them): one
    World for all ranks, one per node, one per local rank across the nodes (the process sets of
    hvdcompress.engines.two_level). Results in rank order."""
    size = nodes * per_node
    everyone = World(size, timeout)
    node_worlds = [World(per_node, timeout) for _ in range(nodes)]
    cross_worlds = [World(nodes, timeout) for _ in range(per_node)]

    def rank_body(rank: int) -> Any:
        node, local = divmod(rank, per_node)
        return body(SimulatedCollectives(everyone, rank),
                    SimulatedCollectives(node_worlds[node], local),
                    SimulatedCollectives(cross_worlds[local], node))
    return _run_threads(size, [everyone] + node_worlds + cross_worlds, rank_body, timeout, threads)


def _run_threads(size: int, worlds: list, rank_body: Callable[[int], Any], timeout: float,
                 threads: Optional[int] = None) -> list:
    """``rank_body(rank)`` in one thread per rank, each first pinned to ``threads`` torch
    threads if given; a failure aborts every world's barrier."""
    results: list = [None] * size
    errors: list = []
    saved = torch.get_num_threads()

    def run(rank: int) -> None:
        try:
            if threads is not None:
                torch.set_num_threads(threads)   # this thread's OpenMP and MKL: set per thread
            results[rank] = rank_body(rank)
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors.append((rank, e))
            for world in worlds:
                world.barrier.abort()

    workers = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout + 5)
    if threads is not None:
        torch.set_num_threads(saved)   # the count is also process-wide: this thread's again
    if errors:
        raise errors[0][1]
    if any(t.is_alive() for t in workers):
        raise TimeoutError(f"simulated ranks still running after {timeout} s")
    return results
