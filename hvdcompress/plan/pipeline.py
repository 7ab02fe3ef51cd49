"""One training step as a pipeline: the backward pass hands gradients to Horovod's background
thread, which fuses and sends them while the backward goes on.

Horovod's loop (0.21 and later: ``HOROVOD_CYCLE_TIME`` 1 ms, ``HOROVOD_FUSION_THRESHOLD``
128 MiB; 64 MiB and 5 ms before): every cycle it takes the tensors that became ready, packs
consecutive ones with the same collective into fusion buffers of at most the threshold, and
runs those collectives one after the other; the next cycle starts one cycle time after this
one started, or when its collectives end if later. A fused collective pays its latency once
and the transfer of each of its tensors (:class:`hvdcompress.plan.collectives.Cost`).

The exchange engine (:mod:`hvdcompress.engines.exchange`) launches a tensor's first round from its
gradient hook and runs the later rounds (PowerSGD's Q, CSC's chunks, the compressed allreduce's
allgather, the two-level exchange's cross-node and node rounds) and the decoding in
``synchronize``, after the backward. So::

    round 0     : the cycle loop above, from each tensor's ready time (overlaps the backward)
    synchronize : at max(end of the backward, end of round 0's collectives)
                  + the later rounds, fused round by round
                  + the decoding of every tensor
    step        = synchronize's end + the optimizer's step

Compression runs in the gradient hook on the compute stream: it delays the rest of the
backward by its time (every later ready time and the backward's end shift by it).

Trade-offs: one network resource per rank (rounds do not overlap one another); decoding is
not overlapped with the later rounds of other tensors (pessimistic); Horovod's negotiation
cost and response cache are not modelled beyond the cycle time.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, Sequence

FUSION_THRESHOLD = 128 * 1024 * 1024
CYCLE_S = 1e-3


@dataclass(frozen=True)
class Fusion:
    """Horovod's tensor fusion: ``threshold_bytes`` per fused collective (0: no fusion) and
    the background thread's ``cycle_s``."""

    threshold_bytes: int = FUSION_THRESHOLD
    cycle_s: float = CYCLE_S

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Fusion":
        """Read ``HOROVOD_FUSION_THRESHOLD`` (bytes) and ``HOROVOD_CYCLE_TIME`` (ms)."""
        env = os.environ if env is None else env
        threshold = int(env.get("HOROVOD_FUSION_THRESHOLD", FUSION_THRESHOLD))
        cycle = float(env.get("HOROVOD_CYCLE_TIME", CYCLE_S * 1e3)) / 1e3
        return cls(threshold, cycle)


class Job(NamedTuple):
    """One tensor's exchange: ``rounds`` of (fusion key, :class:`Cost`); ``fusion_bytes`` it
    takes in a fusion buffer; ``hook_s`` of compression in its gradient hook; ``sync_s`` of
    decoding in ``synchronize``."""

    name: str
    ready_s: float
    rounds: tuple
    fusion_bytes: int
    hook_s: float = 0.0
    sync_s: float = 0.0


class Timeline(NamedTuple):
    """When the backward ended, round 0's collectives ended, and the step ended."""

    backward_end_s: float
    first_round_end_s: float
    step_s: float


def fused_time(jobs: Sequence[Job], round_index: int, threshold: int) -> float:
    """Seconds of round ``round_index`` of ``jobs`` (in order) run as Horovod fuses them:
    consecutive jobs with the same key share a collective while their bytes fit the threshold."""
    total, key, used, latency = 0.0, None, 0, 0.0
    for job in jobs:
        if len(job.rounds) <= round_index:
            continue
        job_key, cost = job.rounds[round_index]
        if job_key != key or used + job.fusion_bytes > threshold:
            total += latency
            key, used, latency = job_key, 0, cost.latency_s
        latency = max(latency, cost.latency_s)
        used += job.fusion_bytes
        total += cost.transfer_s
    return total + latency


def simulate(jobs: Sequence[Job], backward_s: float, optimizer_s: float, fusion: Fusion) -> Timeline:
    """The step's timeline (see the module doc); ``jobs`` in the order they become ready."""
    staged, shift = [], 0.0
    for job in jobs:
        shift += job.hook_s
        staged.append(job._replace(ready_s=job.ready_s + shift))
    backward_end = backward_s + shift
    clock, chain, i = 0.0, 0.0, 0
    while i < len(staged):
        ready = staged[i].ready_s
        if ready > clock:
            clock = ready if fusion.cycle_s <= 0 else clock + math.ceil((ready - clock) / fusion.cycle_s) * fusion.cycle_s
        end = i
        while end < len(staged) and staged[end].ready_s <= clock:
            end += 1
        chain = max(chain, clock) + fused_time(staged[i:end], 0, fusion.threshold_bytes)
        clock = max(clock + fusion.cycle_s, chain)
        i = end
    later = sum(fused_time(staged, r, fusion.threshold_bytes)
                for r in range(1, max((len(j.rounds) for j in staged), default=1)))
    synchronize = max(backward_end, chain) + later + sum(job.sync_s for job in staged)
    return Timeline(backward_end, chain, synchronize + optimizer_s)

