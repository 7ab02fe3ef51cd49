"""What ``compression="auto"`` may pick, and the pick for one tensor: a pure function of the
tensor's shape, the number of ranks, the link and the codec calibration, so that every rank
given the same inputs picks the same.

**The choice.** For a tensor of shape s on P ranks over a link (alpha, beta), every allowed
compressor c and every collective k its payloads can take (``allreduce`` when they are summable;
else ``allgather``, and the compressed allreduce ``alltoall`` where c supports it) costs, with
the formulas of :mod:`hvdcompress.plan` (measured payloads, alpha-beta collectives, calibrated
codec time), what it adds to a step::

    t(c, k) = sum over the rounds of the transfer (bytes / beta)  +  codec time (hook + sync)
              + the front end's cost per tensor of c (where the calibration holds one:
                ``python -m hvdcompress.plan --calibrate-job``, :mod:`hvdcompress.torch.job_costs`)

e.g. ``none``: 2(P-1)/P · 4n/beta; ``fp16``: 2(P-1)/P · 2n/beta + compress(n) + decode(n);
``int8`` by the compressed allreduce: 2(P-1)/P · B/beta (B its P segments' payloads) + P
compressions of n/P elements + the decoding, re-compression and decoding of the segments. The
tensor takes the cheapest (c, k); ties go to fewer bytes on the wire, then to the allowed order.

**Trade-off.** The latency is left out of the pick: Horovod fuses the tensors of a cycle that
take the same collective, so a step pays each collective's 2(P-1)·alpha (allreduce), (P-1)·alpha
(allgather) or both rounds of the compressed allreduce about once, whatever the number of
tensors; costed alone, a bias would flee the allreduce's latency for an allgather that the step
then pays on top. Each tensor is costed by itself, independent of the order tensors arrive in
and checkable by hand; fusion, latencies and the rounds' order are in the step's prediction
(:func:`predict_exchange`, :func:`hvdcompress.plan.simulate`), which leaves out the overlap
with the backward pass (the re-plan check measures it). Convergence is not modelled: hence a
default of compressors that do not change accuracy measurably (:data:`SAFE`); aggressive ones
only when listed.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Optional

from ..contract.compressor import Compressor
from ..plan.calibration import Calibration
from ..plan.device import Device
from ..plan.exchanges import COLLECTIVES, Exchange, exchange
from ..plan.links import Cluster, Link, parse_bandwidth, parse_latency
from ..plan.payloads import DEFAULT_COMPRESSORS, FP16
from ..plan.pipeline import Fusion, Job, simulate
from ..registry import from_params

#: The labels ``auto_allowed`` may name: the plan's compressors and bf16, label -> spec.
CHOICES: dict = {"none": DEFAULT_COMPRESSORS["none"], "fp16": DEFAULT_COMPRESSORS["fp16"],
                 "bf16": {"compressor": "bf16"}, "int8": DEFAULT_COMPRESSORS["int8"],
                 **DEFAULT_COMPRESSORS}
#: The default allowed set: no measurable change in accuracy (int8: per-chunk scales).
SAFE = ("none", "fp16", "bf16", "int8")


def _picks_alone(compressor: Compressor) -> bool:
    """Whether auto can pick ``compressor`` per tensor: it only compresses (it is not auto and
    takes over neither the optimizer's momentum nor its Adam step, which would change with the
    tensor's pick)."""
    return not (compressor.name == "auto" or compressor.takes_over_momentum or
                compressor.takes_over_adam)


#: The labels of :data:`CHOICES` that auto can pick (dgc and csc take over the momentum).
PICKABLE = tuple(label for label, spec in CHOICES.items() if _picks_alone(from_params(spec)))
_ALLOWED_FORMS = (f"labels ({', '.join(PICKABLE)}) or dicts for hvdcompress.from_params, as a "
                  "list or a comma-separated string; default: " + ",".join(SAFE))


class Choice(NamedTuple):
    """One tensor's pick: the compressor's ``label``, the ``collective`` its payloads take, the
    ``seconds`` it adds to a step (transfer and codec), the bytes one rank sends, and the
    model's :class:`Exchange`."""

    label: str
    collective: str
    seconds: float
    wire_bytes: float
    plan: Exchange


def _label(spec: Mapping[str, Any]) -> str:
    """A readable label of a spec dict: ``compressor=topk,ef=vanilla,k=0.01``."""
    rest = sorted((k, v) for k, v in spec.items() if k != "compressor")
    return ",".join([f"compressor={spec.get('compressor')}", *(f"{k}={v}" for k, v in rest)])


def _check_spec(param: str, value: Any, item: Any, spec: Mapping[str, Any]) -> Compressor:
    """The compressor of one allowed item; a ValueError naming ``param`` for one auto cannot use."""
    try:
        compressor = from_params(spec)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{param}={value!r}: {item!r} cannot be built ({error}); allowed: "
                         f"{_ALLOWED_FORMS}") from None
    if not _picks_alone(compressor):
        raise ValueError(f"{param}={value!r}: {item!r} takes over the optimizer's momentum or "
                         "Adam step (or is auto itself), which would change with the tensor's "
                         f"pick; allowed: compressors that only compress: {_ALLOWED_FORMS}")
    return compressor


def parse_allowed(value: Any, param: str = "allowed") -> dict:
    """``value`` (None: :data:`SAFE`) as label -> spec, in the order given; each item checked
    by building it. Errors name ``param``, the value and what is allowed."""
    items = SAFE if value is None else value
    if isinstance(items, str):
        items = [s.strip() for s in items.split(",")]
    if isinstance(items, Mapping) or not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{param}={value!r} is not a non-empty list; allowed: {_ALLOWED_FORMS}")
    specs: dict = {}
    for item in items:
        if isinstance(item, str) and item in CHOICES:
            label, spec = item, CHOICES[item]
        elif isinstance(item, Mapping):
            label, spec = _label(item), dict(item)
        else:
            raise ValueError(f"{param}={value!r}: {item!r} is unknown; allowed: {_ALLOWED_FORMS}")
        if label in specs:
            raise ValueError(f"{param}={value!r}: {label!r} is listed twice; allowed: each once")
        _check_spec(param, value, item, spec)
        specs[label] = spec
    return specs


def _quantity(param: str, key: str, value: Any, parse: Any) -> float:
    """A bandwidth or latency: a string with its unit, or a number > 0 in bytes/s or seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value < math.inf:
            raise ValueError(f"{param}[{key!r}]={value!r} is not positive; allowed: a number > 0 "
                             "(bytes/s, seconds) or a string such as '10gbit' / '50us'")
        return float(value)
    return parse(f"{param}[{key!r}]", value)


def parse_link(value: Any, param: str = "link") -> Optional[Link]:
    """``value`` as a :class:`Link`: None (measure it), a Link, ``{"bandwidth": "10gbit",
    "latency": "50us"}`` (numbers: bytes/s and seconds) or the string ``"10gbit,50us"``."""
    allowed = ("None (measured over the process set), a hvdcompress.plan.Link, "
               "{'bandwidth': '10gbit', 'latency': '50us'} or '10gbit,50us'")
    if value is None:
        return None
    if isinstance(value, Link):
        if not (value.alpha_s >= 0 and value.beta_bytes_per_s > 0):
            raise ValueError(f"{param}={value!r}: alpha_s must be >= 0 and beta_bytes_per_s > 0")
        return value
    if isinstance(value, str) and value.count(",") == 1:
        bandwidth, latency = value.split(",")
        value = {"bandwidth": bandwidth, "latency": latency}
    if not isinstance(value, Mapping) or set(value) != {"bandwidth", "latency"}:
        raise ValueError(f"{param}={value!r} is not a link; allowed: {allowed}")
    return Link(_quantity(param, "latency", value["latency"], parse_latency),
                _quantity(param, "bandwidth", value["bandwidth"], parse_bandwidth))


def flat_cluster(ranks: int, link: Link) -> Cluster:
    """The process set as the model sees it: P ranks behind one link (one level, flat)."""
    return Cluster(nodes=1, gpus_per_node=ranks, intra=link, inter=link)


def _seconds(plan: Exchange) -> float:
    """What a tensor adds to a fused step: its transfers and its codec time."""
    return sum(cost.transfer_s for _, cost in plan.rounds) + plan.hook_s + plan.sync_s


def choose(shape: tuple, cluster: Cluster, allowed: Mapping[str, Mapping[str, Any]],
           calibration: Optional[Calibration] = None, device: Optional[Device] = None) -> Choice:
    """The cheapest (compressor, collective) for one tensor of ``shape`` (see the module doc);
    payloads measured on ``device`` (default torch's; sizes do not depend on it). The cost per
    tensor weighs in the pick only: the step's prediction (:func:`predict_exchange`) and the
    re-plan check keep to the network and the codecs, whose ratios they measure."""
    best, best_key = None, None
    for order, (label, spec) in enumerate(allowed.items()):
        front = calibration.tensor_s(spec) if calibration is not None else 0.0
        for collective in COLLECTIVES:
            plan = exchange(spec, shape, collective, "flat", cluster, CHOICES[FP16], calibration, device)
            if plan is None:
                continue
            choice = Choice(label, plan.collective, _seconds(plan) + front, plan.wire_bytes, plan)
            key = (choice.seconds, choice.wire_bytes, order)
            if best_key is None or key < best_key:
                best, best_key = choice, key
    return best


def predict_exchange(choices: Mapping[str, Choice], fusion: Fusion, codec: bool = True) -> float:
    """Seconds of one step's exchange of ``choices`` (tensor name -> Choice) as Horovod runs it
    (:func:`hvdcompress.plan.simulate`, fused, in name order, every gradient ready at once: no
    overlap counted); ``codec=False``: the network's part alone."""
    jobs = [Job(name, 0.0, c.plan.rounds, c.plan.fusion_bytes,
                c.plan.hook_s if codec else 0.0, c.plan.sync_s if codec else 0.0)
            for name, c in sorted(choices.items())]
    return simulate(jobs, 0.0, 0.0, fusion).step_s
