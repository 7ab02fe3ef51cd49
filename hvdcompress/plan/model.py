"""Predict the step time of every compressor × collective × level on a cluster, and pick one.

For each combination, every tensor of the profile becomes a :class:`~hvdcompress.plan.pipeline.Job`
(its exchange from :mod:`hvdcompress.plan.exchanges`: measured payloads, alpha-beta collectives,
calibrated codec time) and :func:`~hvdcompress.plan.pipeline.simulate` runs the step. The
speed-ups are against Horovod as it is: a flat ring allreduce of the dense gradients
(``none``) and of fp16 gradients (Horovod's ``Compression.fp16``).

The profile's times are one rank's with a core of its own; on a cluster whose CPU ranks
outnumber the cores (``Cluster.cpu_share`` > 1) the ready times, the backward's end and the
optimizer's step stretch by the share, as the codec and reduction times do
(:mod:`hvdcompress.plan.exchanges`).

Determinism: the prediction depends only on its inputs (payload sizes depend on shapes and
configuration, not on values; the calibration is an input), combinations are visited in a
fixed order and :func:`recommend` breaks ties by bytes, then by name, so every rank given the
same inputs (and the same calibration file) picks the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from .calibration import Calibration
from .exchanges import COLLECTIVES, LEVELS, exchange
from .front_ends import HOROVOD, FrontEnd, native
from .links import Cluster
from .payloads import DEFAULT_COMPRESSORS, DENSE, FP16
from .pipeline import Fusion, Job, simulate
from .profile import ModelProfile


@dataclass(frozen=True)
class Prediction:
    """One combination's predicted step: ``step_time_s``; ``wire_bytes_per_rank``, the bytes one
    rank sends per step in the compressor's collectives (every round; for two-level, those
    between nodes); the speed-ups against Horovod's dense and fp16 allreduce; the seconds of
    codec time in the step (0 without a calibration); ``node_bytes_per_rank``, the two-level
    node rounds' bytes (intra-node link; 0 for flat)."""

    compressor: str
    collective: str
    level: str
    step_time_s: float
    wire_bytes_per_rank: float
    speedup_vs_dense: float
    speedup_vs_fp16: float
    codec_s: float = 0.0
    node_bytes_per_rank: float = 0.0


def _step(profile: ModelProfile, cluster: Cluster, spec: Mapping[str, str], collective: str,
          level: str, intra_node: Mapping[str, str], calibration: Optional[Calibration],
          fusion: Fusion, front_end: FrontEnd = HOROVOD) -> Optional[tuple]:
    """(step seconds, wire bytes, collective label, codec seconds, node bytes) of one combination."""
    jobs, used, wire, node, share = [], set(), 0.0, 0.0, cluster.cpu_share
    copy_s = share * (calibration.copy_s_per_byte if calibration is not None else 0.0)
    hook_copies, sync_copies = front_end.copies(dense=spec.get("compressor") == DENSE)
    per_tensor = calibration is not None and (front_end.native_per_tensor or not native(spec))
    for tensor in profile.tensors:
        plan = exchange(spec, tensor.shape, collective, level, cluster, intra_node, calibration)
        if plan is None:
            return None
        used.add(plan.collective)
        wire, node = wire + plan.wire_bytes, node + plan.node_bytes
        gradient_s = copy_s * 4 * tensor.numel   # one pass over a float32 gradient
        front_s = share * calibration.tensor_s(spec, tensor.members) if per_tensor else 0.0
        jobs.append(Job(tensor.name, share * tensor.ready_s, plan.rounds, plan.fusion_bytes,
                        plan.hook_s + hook_copies * gradient_s + front_s, plan.sync_s + sync_copies * gradient_s))
    timeline = simulate(jobs, share * profile.backward_s, share * profile.optimizer_s, fusion)
    label = collective if collective in used else "allreduce"
    return timeline.step_s, wire, label, sum(j.hook_s + j.sync_s for j in jobs), node


def predict(profile: ModelProfile, cluster: Cluster,
            compressors: Mapping[str, Mapping[str, str]] = DEFAULT_COMPRESSORS,
            collectives: Sequence[str] = COLLECTIVES, levels: Sequence[str] = LEVELS,
            intra_node: Mapping[str, str] = DEFAULT_COMPRESSORS[FP16],
            calibration: Optional[Calibration] = None, fusion: Fusion = Fusion(),
            baseline: Optional[ModelProfile] = None, front_end: FrontEnd = HOROVOD) -> list:
    """A :class:`Prediction` per existing combination, in the order of ``compressors`` (labels
    to specs for :func:`hvdcompress.from_params`), then ``collectives``, then ``levels``.
    A compressor whose payloads are all summable gives one 'allreduce' row per level.
    ``baseline``: the profile Horovod's dense and fp16 run on, for the speed-ups (default
    ``profile``; a fused profile, :func:`hvdcompress.plan.profile.fused`, passes the original).
    ``front_end``: the gradient copies it makes beside the exchange (:mod:`hvdcompress.plan.front_ends`);
    the speed-ups are against the same front end's dense and fp16."""
    reference = {name: _step(baseline or profile, cluster, DEFAULT_COMPRESSORS[name], "allgather", "flat",
                             intra_node, calibration, fusion, front_end)[0] for name in (DENSE, FP16)}
    rows, seen = [], set()
    for label, spec in compressors.items():
        for collective in collectives:
            for level in levels:
                result = _step(profile, cluster, spec, collective, level, intra_node, calibration, fusion,
                               front_end)
                if result is None or (label, result[2], level) in seen:
                    continue
                seen.add((label, result[2], level))
                step, wire, used, codec, node = result
                rows.append(Prediction(label, used, level, step, wire, reference[DENSE] / step,
                                       reference[FP16] / step, codec, node))
    return rows


def recommend(predictions: Iterable[Prediction]) -> Prediction:
    """The fastest prediction; ties (within 0.1%) go to fewer bytes, then to the name order."""
    rows = list(predictions)
    if not rows:
        raise ValueError("recommend: no predictions to choose from")
    best = min(row.step_time_s for row in rows)
    close = [row for row in rows if row.step_time_s <= best * 1.001]
    return min(close, key=lambda r: (r.wire_bytes_per_rank, r.compressor, r.collective, r.level))
