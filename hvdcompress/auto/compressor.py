"""``compression="auto"``: a compressor that hands each tensor to the compressor and collective
the cost model picks for it (:mod:`hvdcompress.auto.choice`), planned at the first exchange.

**When.** At the first exchange, when the engine asks for the first tensor's collective
(:class:`hvdcompress.transport.collectives.Planner`): the link is measured then (or taken from ``link=``) and
the calibration loaded, rank 0's both handed to every rank; each tensor is then picked the
first time it is exchanged, from its shape alone. The first exchange is where every front end
knows its tensors and has its collectives (the TF tape and Keras optimizer do not know their
variables before), and the choice needs no list of all tensors, so it cannot depend on the
order in which ranks' gradients become ready. At the end of the first step every rank checks
that all ranks picked the same (:func:`hvdcompress.step.agreement.check_ranks_agree`) and rank 0
logs the plan and the predicted exchange time.

**Check, then re-plan once.** The model does not know the step's compute; it predicts the
exchange's time P (network N plus codec K, :func:`~hvdcompress.auto.choice.predict_exchange`). Over
:data:`CHECK_STEPS` steps after :data:`WARMUP_STEPS`, each rank measures its step time S
(between the ends of two steps) and E, the time it spent in the engine (compressing, launching,
waiting, decoding: :attr:`hvdcompress.engines.exchange.Exchange.busy_s`); the means over ranks (one
allreduce, identical on every rank) give the predicted step C + P with C = S - E, the measured
compute. If S is off by more than :data:`TOLERANCE` of C + P, i.e. ``|E - P| > 25% (C + P)``,
every tensor is picked again at its next exchange, with what the engine saw:

* the codec times scaled by k = K'/K, K' the seconds measured inside the compressors (compress
  and decode; :class:`Dispatch` clocks them) and K = P - N the predicted ones: the codecs may run
  slower in the job than alone at calibration (ranks sharing cores, a busy device);
* the link scaled by f = (E - K') / N (alpha·f, beta/f: the network as the engine waited on it,
  overlap with the backward and Horovod's own overheads included).

Trade-off: on a GPU the clock around a codec sees its launches, not its kernels (no device
sync is added to the step), so K' is low and the excess lands in the link's factor.

**Then time the alternatives.** A model can be off in kind, not only in scale, and a plan's own
prediction can hold while another plan would be faster (ranks sharing cores make Horovod's
collectives CPU-bound: at 4 ranks on 2 cores and 10 Gbit/s int8's compressed allreduce took
longer than the dense allreduce of 4x its bytes, which the probe's link, itself slowed by the
shared cores, predicted well for int8 and badly for dense). So after the check, each plan that
differs from the model's and from each other is *timed* over :data:`CHECK_STEPS` steps: the
re-planned one (after a failed check) and, where ``none`` is allowed, every tensor sent as it is
(Horovod's own exchange, the baseline ``auto`` must not lose to). The plan with the fastest mean
step over ranks is kept (the model's on a tie); the means come from one allreduce each, so
every rank keeps the same. The price: up to 2·CHECK_STEPS steps on plans that may be slower,
once per job (``replan=False`` skips the check and the trials).

**State.** A tensor's sub-compressor keeps its state in the tensor's own state dict under
``<label>/`` (a re-plan that changes a tensor's compressor starts the new one's state fresh and
leaves the old one's in place), and the compressor-wide counters under the same prefix, so
checkpoints work as with any compressor. The plan itself is not checkpointed: a restarted job
plans again.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any, Mapping, NamedTuple, Optional, Union

import numpy as np

from ..contract.compressor import TensorInfo
from ..engines.exchange import Exchange
from ..ops.facade import Tensor
from ..plan.calibration import Calibration
from ..plan.links import Link
from ..plan.pipeline import Fusion
from ..registry import from_params
from ..step.agreement import check_ranks_agree
from ..transport.collectives import Planner
from .choice import SAFE, choose, flat_cluster, parse_allowed, parse_link, predict_exchange
from .dispatch import Dispatch
from .probe import engine_device, from_rank0, machine_calibration, measure_link, on_gpu

log = logging.getLogger("hvdcompress")
WARMUP_STEPS = 3     # steps before the check (the first one plans and checks the agreement)
CHECK_STEPS = 5      # steps measured for the check
TOLERANCE = 0.25     # re-plan when the step is off by more than this share of the prediction
CODEC_BOUND = 10.0   # the re-plan scales the codec times by at most this factor (or 1/it)
CALIBRATIONS = ("machine", None)


class Replan(NamedTuple):
    """The re-plan check's verdict: its ``error``, and the ``link`` and ``codec_factor`` to plan
    with again (None, 1.0: keep the plan)."""

    error: float
    link: Optional[Link]
    codec_factor: float = 1.0


def replan_inputs(link: Link, step_s: float, exchange_s: float, codec_s: float,
                  predicted_s: float, network_s: float) -> Replan:
    """The re-plan rule (see the module doc): ``step_s``, ``exchange_s`` and ``codec_s``
    measured (S, E and K'), ``predicted_s`` the exchange's prediction (P), ``network_s`` its
    network part (N). With C = S - E the compute, error = |E - P| / (C + P); above
    :data:`TOLERANCE` the codecs are scaled by k = K'/K (K = P - N; 1 when K is under 5% of P,
    too little to measure a ratio on, e.g. codec time left out; within 1/:data:`CODEC_BOUND`
    and :data:`CODEC_BOUND`) and the link by f = (E - K') / N (at least 5%: f > 0)."""
    compute = max(step_s - exchange_s, 0.0)
    error = abs(exchange_s - predicted_s) / max(compute + predicted_s, 1e-12)
    if error <= TOLERANCE or network_s <= 0:
        return Replan(error, None)
    codec = predicted_s - network_s
    codec_factor = min(max(codec_s / codec, 1 / CODEC_BOUND), CODEC_BOUND) \
        if codec >= 0.05 * predicted_s and codec_s > 0 else 1.0
    factor = max(exchange_s - codec_s, 0.05 * network_s) / network_s
    scaled = replace(link, alpha_s=link.alpha_s * factor, beta_bytes_per_s=link.beta_bytes_per_s / factor)
    return Replan(error, scaled, codec_factor)


class Auto(Dispatch, Planner):
    """``compression="auto"`` (see the module doc).

    ``allowed``: what it may pick, labels (:data:`hvdcompress.auto.choice.PICKABLE`) or
    :func:`hvdcompress.from_params` dicts, a list or a comma-separated string; default the
    accuracy-safe ``none, fp16, bf16, int8``. ``link``: None (measured over the process set at
    the first exchange), a :class:`hvdcompress.plan.Link`, ``{"bandwidth": "10gbit", "latency":
    "50us"}`` or ``"10gbit,50us"``. ``calibration``: ``"machine"`` (this machine's cached codec
    times, the missing ones measured now), None (codec time left out) or a
    :class:`~hvdcompress.plan.Calibration`. ``replan``: check the prediction after warm-up and
    re-plan once if it is off by more than 25%.

    After the first step: :attr:`plan` (tensor name -> (label, collective)), :attr:`network`
    (the link planned with), :attr:`predicted_exchange_s`, :attr:`checks` (the re-plan check).
    """

    @classmethod
    def from_arguments(cls, compression: Any, auto_allowed: Any = None, link: Any = None) -> Optional["Auto"]:
        """The front ends' ``compression="auto"`` with ``auto_allowed=`` and ``link=`` as an
        :class:`Auto`; None for any other ``compression``, which then takes neither argument."""
        if isinstance(compression, str) and compression == cls.name:
            parse_allowed(auto_allowed, "auto_allowed")   # errors named as the front end spells them
            return cls(allowed=auto_allowed, link=parse_link(link, "link"))
        for key, value in (("auto_allowed", auto_allowed), ("link", link)):
            if value is not None:
                raise ValueError(f"{key}={value!r} without compression='auto'; allowed: None, or "
                                 f"compression='auto' (with compression={compression!r}, give "
                                 "allowed= and link= to hvdcompress.auto.Auto or from_params)")
        return None

    def __init__(self, allowed: Union[str, list, tuple] = SAFE, link: Union[str, Mapping, Link, None] = None,
                 calibration: Union[str, Calibration, None] = "machine", replan: bool = True):
        specs = parse_allowed(allowed)
        super().__init__({label: from_params(spec) for label, spec in specs.items()}, {})
        if not (isinstance(calibration, Calibration) or calibration in CALIBRATIONS):
            raise ValueError(f"calibration={calibration!r}: allowed: 'machine' (this machine's "
                             "cached codec times), None (codec time left out) or a "
                             "hvdcompress.plan.Calibration")
        if not isinstance(replan, bool):
            raise ValueError(f"replan={replan!r}: allowed: True or False")
        self.allowed = tuple(specs)
        self.link = parse_link(link)
        self.calibration = calibration if isinstance(calibration, (str, type(None))) else "given"
        self.replan = replan
        self._specs, self._given = specs, calibration
        self._inputs: Optional[tuple] = None   # (link, calibration, fusion) from rank 0
        self._picked: dict = {}                # tensor name -> Choice
        self._shapes: dict = {}                # tensor name -> the shape it was picked for
        self._trials: list = []                # plans still to time after a failed check
        self._tried: list = []                 # (label, inputs, picks, mean step s) timed so far
        self._fresh = False                    # picks not yet agreed on and logged
        self._steps, self._mark = 0, None
        self._sample: Any = None               # a one-element tensor on the gradients' device
        self._device: Any = None               # where payloads and codecs are measured
        self.predicted_exchange_s: Optional[float] = None
        self.checks: list = []

    def arguments(self) -> dict:
        """The constructor's arguments (the same on every rank: the rank agreement compares them)."""
        return {"allowed": self.allowed, "link": self.link, "calibration": self.calibration,
                "replan": self.replan}

    @property
    def plan(self) -> dict:
        """Tensor name -> (compressor label, collective), in name order."""
        return {name: (c.label, c.collective) for name, c in sorted(self._picked.items())}

    @property
    def network(self) -> Optional[Link]:
        """The link the plan was made for (rank 0's, scaled by a re-plan)."""
        return None if self._inputs is None else self._inputs[0]

    # ---- the engine's questions ----------------------------------------------------------------
    def collective_of(self, info: TensorInfo, engine: Exchange, like: Tensor) -> str:
        """Pick the tensor's compressor and collective on its first exchange (see the module doc)."""
        if info.name not in self._picked:
            if self._inputs is None:
                self._inputs = self._gather_inputs(engine, like)
            link, calibration, _ = self._inputs
            shape = info.shape if math.prod(info.shape or (0,)) == info.numel else (info.numel,)
            choice = choose(shape, flat_cluster(engine.comm.world, link), self._specs, calibration,
                            self._device)
            self._picked[info.name], self._choice[info.name] = choice, choice.label
            self._shapes[info.name] = shape
            self._fresh = True
        return self._picked[info.name].collective

    def _gather_inputs(self, engine: Exchange, like: Tensor) -> tuple:
        """(link, calibration, fusion): measured or given on rank 0, the same on every rank."""
        comm, ops = engine.comm, engine.ops
        self._sample = ops.zeros(1, like=like, dtype="float32")   # for the metadata collectives
        self._device = engine_device(ops, like)
        link = measure_link(comm, ops, like) if self.link is None else \
            replace(self.link, half_duplex_pairs=self.link.half_duplex_pairs
                    or comm.pairs_take_turns(on_gpu(like)))   # a given link, on this transport
        mine = None
        if comm.rank == 0:
            calibration = machine_calibration(self._specs.values(), self._device) \
                if self._given == "machine" else self._given
            mine = (link, calibration, Fusion.from_env())
        return from_rank0(mine, comm, ops, self._sample)

    def after_step(self, engine: Exchange) -> None:
        """Agree on and log fresh picks; time the steps after warm-up and re-plan once."""
        self._steps += 1
        if self._fresh and self._picked:
            self._fresh = False
            self._agree_and_log(engine)
        if not self.replan or (self.checks and not self._trials):
            return
        if self._steps == WARMUP_STEPS:
            self._mark = (time.perf_counter(), engine.busy_s, self.codec_s)
        elif self._steps == WARMUP_STEPS + CHECK_STEPS:
            self._check(engine)
        elif self._steps > WARMUP_STEPS + CHECK_STEPS and \
                (self._steps - WARMUP_STEPS) % CHECK_STEPS == 0:
            self._end_trial(engine)

    # ---- agreement, log, re-plan -----------------------------------------------------------------
    def _agree_and_log(self, engine: Exchange) -> None:
        link = self.network
        mine = {"auto plan": sorted((n, c.label, c.collective) for n, c in self._picked.items()),
                "link": (link.alpha_s, link.beta_bytes_per_s)}
        check_ranks_agree(mine, engine.comm, engine.ops, self._sample, "hvdcompress auto")
        self.predicted_exchange_s = predict_exchange(self._picked, self._inputs[2])
        if engine.comm.rank != 0:
            return
        rows = ["tensor | numel | compressor | collective | alone s | wire B/rank"]
        rows += [f"{name} | {engine.plan.get(name, (0,))[0]} | {c.label} | {c.collective} | "
                 f"{c.seconds:.3g} | {c.wire_bytes:.0f}" for name, c in sorted(self._picked.items())]
        log.info("hvdcompress auto plan (P=%d, link alpha=%.3g s, beta=%.4g B/s, codec time %s): "
                 "predicted exchange %.4g s per step (the step: that plus its compute)\n%s",
                 engine.comm.world, link.alpha_s, link.beta_bytes_per_s,
                 "calibrated" if self._inputs[1] is not None else "left out",
                 self.predicted_exchange_s, "\n".join(rows))

    def _check(self, engine: Exchange) -> None:
        """Compare the measured steps with the prediction (means over ranks) and re-plan once
        if they are off by more than :data:`TOLERANCE` (see the module doc)."""
        comm = engine.comm
        began, busy, codec = self._mark
        step_s, exchange_s, codec_s = self._mean_step(
            engine, [time.perf_counter() - began, engine.busy_s - busy, self.codec_s - codec], "check")
        link, calibration, fusion = self._inputs
        predicted = self.predicted_exchange_s
        verdict = replan_inputs(link, step_s, exchange_s, codec_s, predicted,
                                predict_exchange(self._picked, fusion, codec=False))
        compute = max(step_s - exchange_s, 0.0)
        self.checks.append({"step_s": step_s, "exchange_s": exchange_s, "codec_s": codec_s,
                            "predicted_step_s": compute + predicted, "error": verdict.error,
                            "replanned": verdict.link is not None, "codec_factor": verdict.codec_factor,
                            "kept": "model"})
        if comm.rank == 0:
            log.info("hvdcompress auto: measured step %.4g s (exchange %.4g s, codecs %.4g s), "
                     "predicted %.4g s (compute %.4g + exchange %.4g): off by %.0f%%%s", step_s,
                     exchange_s, codec_s, compute + predicted, compute, predicted, 100 * verdict.error,
                     f"; re-planning with the codecs x{verdict.codec_factor:.3g} and the link scaled "
                     "to what the exchange waited" if verdict.link else "")
        candidates = [("none", self._inputs, {"none": self._specs["none"]})] if "none" in self._specs else []
        if verdict.link is not None:
            scaled = calibration.scaled(verdict.codec_factor) if calibration is not None else None
            candidates.insert(0, ("replanned", (verdict.link, scaled, fusion), self._specs))
        self._start_trials(engine, step_s, candidates)

    def _mean_step(self, engine: Exchange, seconds: list, tag: str) -> list:
        """``seconds`` measured over :data:`CHECK_STEPS` steps on this rank, as means per step
        over the ranks (one allreduce: the same on every rank)."""
        comm, ops = engine.comm, engine.ops
        mine = ops.from_numpy(np.array(seconds, np.float64), self._sample)
        total = ops.to_numpy(comm.wait(comm.allreduce([mine], f"hvdc.auto.{tag}"))[0])
        return [float(v) / (CHECK_STEPS * comm.world) for v in total]

    # ---- trials: the plans timed after a failed check ------------------------------------------
    def _plan_with(self, engine: Exchange, inputs: tuple, specs: Mapping) -> dict:
        """Tensor name -> Choice of every tensor seen, picked with ``inputs`` from ``specs``."""
        cluster = flat_cluster(engine.comm.world, inputs[0])
        return {name: choose(shape, cluster, specs, inputs[1], self._device)
                for name, shape in sorted(self._shapes.items())}

    def _start_trials(self, engine: Exchange, step_s: float, candidates: list) -> None:
        """Queue the candidate plans (label, inputs, specs) that differ from the model's and from
        one another; each is timed over :data:`CHECK_STEPS` steps, and the fastest of all kept."""
        def key(picked: dict) -> list:
            return [(n, c.label, c.collective) for n, c in sorted(picked.items())]

        seen = [key(self._picked)]
        self._tried = [("model", self._inputs, dict(self._picked), step_s)]
        for label, inputs, specs in candidates:
            picked = self._plan_with(engine, inputs, specs)
            if key(picked) not in seen:
                seen.append(key(picked))
                self._trials.append((label, inputs, picked))
        self.checks[-1]["trials"] = []
        self._next_trial()

    def _apply(self, inputs: tuple, picked: Mapping) -> None:
        self._inputs, self._picked = inputs, dict(picked)
        self._choice.clear()
        self._choice.update({name: c.label for name, c in picked.items()})
        self._fresh = True

    def _next_trial(self) -> None:
        """Switch to the next queued plan, or keep the fastest timed one when none is left."""
        if self._trials:
            self._apply(*self._trials[0][1:])
            self._mark = (time.perf_counter(), 0.0, 0.0)
            return
        label, inputs, picked, _ = min(self._tried, key=lambda t: t[3])   # first wins a tie
        self.checks[-1]["kept"] = label
        if (inputs, picked) != (self._inputs, self._picked):   # not the plan running now
            self._apply(inputs, picked)

    def _end_trial(self, engine: Exchange) -> None:
        """The mean step over ranks of the plan on trial (the same on every rank: one allreduce)."""
        comm = engine.comm
        step_s, = self._mean_step(engine, [time.perf_counter() - self._mark[0]], "trial")
        label, inputs, picked = self._trials.pop(0)
        self._tried.append((label, inputs, picked, step_s))
        self.checks[-1]["trials"].append({"plan": label, "step_s": step_s})
        if comm.rank == 0:
            log.info("hvdcompress auto: the %s plan took %.4g s per step (the model's: %.4g s)",
                     label, step_s, self._tried[0][3])
        self._next_trial()
