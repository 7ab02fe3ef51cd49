"""Communicating rarely (DiLoCo, Douillard et al. 2023): the outer sync, for every front end.

Every site keeps an anchor x (the parameters at the last sync) and takes H = ``sync_every``
inner steps with its own optimizer, from x to x_i. Then the sites exchange their
pseudo-gradients Δ_i = x − x_i through the exchange engine (any compressor of the library;
error feedback carries what a sync did not send into the next one), average them,

    g = (1/P) Σ_i D(C(Δ_i + e_i)),    e_i ← Δ_i + e_i − D(C(Δ_i + e_i))

and take one outer step on the anchor, SGD with (Nesterov) momentum::

    m ← μ·m + g;    x ← x − η·(g + μ·m)    (nesterov)    or    x ← x − η·m

after which every site restarts from x. Every rank decodes the same payloads and applies the
same float operations, so the parameters are bit-identical on every rank after each sync.

Bytes: one (compressed) model per H steps instead of one gradient per step: H times fewer
with dense pseudo-gradients, H·(dense/sent) with a compressor. The price is H steps of drift:
the sites train apart between syncs, so a site's steps count for less than data-parallel ones
(benchmarks/README.md, "DiLoCo"). :data:`DEFAULT_COMPRESSION` is int8 with error feedback
(INTELLECT-1's int8 outer gradients; 4x per sync), which ended where dense pseudo-gradients
did on the LM benchmark. SparseLoCo's top-k 3% (float32 values and int32 indices here: 16.7x per
sync; its 2-bit values are not a compressor of the library) moves at most 3% of the anchor's
coordinates per sync, so it needs many more syncs than a run of a few hundred steps has.

:class:`OuterSync` holds the anchor, the outer momentum, the step counter and the byte count;
a front end hands it its parameters (flat, as the engine's tensors) and writes the anchors it
returns back into them. Compressors that take the optimizer's momentum or Adam over (DGC, CSC,
``momentum=``, FrozenAdam) and the planner ``"auto"`` are refused: the outer optimizer owns the
momentum, and there is no per-step gradient to plan for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Sequence, Tuple

from ..contract.compressor import Compressor, TensorInfo
from ..contract.validation import check_bool, check_range, is_integer, is_real
from ..engines.accounting import ByteCount
from ..ops.facade import Ops, Tensor
from ..registry import is_planner
from .driver import StepDriver

#: The outer compression when none is given: int8 (a scale per chunk), error feedback.
DEFAULT_COMPRESSION = {"compressor": "int8", "ef": "vanilla"}


@dataclass(frozen=True)
class OuterSettings:
    """The outer loop's settings (checked by :func:`outer_settings`)."""

    sync_every: int
    lr: float
    momentum: float
    nesterov: bool

    def agreement(self) -> dict:
        """What every rank must share besides the engine's settings."""
        return {"sync_every": self.sync_every, "outer_lr": self.lr,
                "outer_momentum": self.momentum, "nesterov": self.nesterov}


def outer_settings(who: str, sync_every: Any, outer_lr: Any, outer_momentum: Any,
                   nesterov: Any) -> OuterSettings:
    """The checked settings; a ValueError naming the parameter, its value and what is allowed."""
    if not is_integer(sync_every) or sync_every < 1:
        raise ValueError(f"{who}: sync_every={sync_every!r} is out of range; allowed: an integer "
                         ">= 1 (the inner steps between two outer syncs)")
    if not is_real(outer_lr) or not 0 < outer_lr < float("inf"):
        raise ValueError(f"{who}: outer_lr={outer_lr!r} is out of range; allowed: a number > 0 "
                         "(DiLoCo's is 0.7)")
    momentum = check_range(who, "outer_momentum", outer_momentum, 0.0, 1.0, high_open=True)
    return OuterSettings(int(sync_every), float(outer_lr), momentum, check_bool(who, "nesterov", nesterov))


def check_outer_compressor(who: str, compressor: Compressor) -> Compressor:
    """``compressor`` if it can compress pseudo-gradients, else a ValueError saying why not."""
    if is_planner(compressor):
        raise ValueError(f"{who}: compression={compressor!r}: 'auto' plans every step's gradient "
                         "exchange for a link; the outer sync sends one pseudo-gradient per "
                         "sync_every steps; allowed: a fixed compressor, e.g. "
                         f"{DEFAULT_COMPRESSION} (the default) or {{'compressor': 'none'}} (dense)")
    if compressor.takes_over_momentum or compressor.takes_over_adam:
        raise ValueError(f"{who}: compression={compressor!r} takes the optimizer's momentum or "
                         "Adam over, and the outer optimizer owns the momentum here (outer_momentum=); "
                         "allowed: a compressor without momentum or Adam, with error feedback for "
                         f"a biased one, e.g. {DEFAULT_COMPRESSION} (the default), "
                         "{'compressor': 'topk', 'k': 0.03, 'ef': 'vanilla'} or {'compressor': 'none'} (dense)")
    return compressor


def outer_step(ops: Ops, state: dict, g: Tensor, settings: OuterSettings) -> Tensor:
    """One outer SGD step on ``state['anchor']`` with momentum ``state['momentum']`` from the
    mean pseudo-gradient ``g``: m ← μ·m + g; x ← x − η·(g + μ·m) (Nesterov) or x − η·m.
    Returns the new anchor (the state's buffer)."""
    m = state["momentum"] * settings.momentum + g
    ops.write(state, "momentum", m)
    direction = g + state["momentum"] * settings.momentum if settings.nesterov else state["momentum"]
    ops.write(state, "anchor", state["anchor"] - direction * settings.lr)
    return state["anchor"]


class OuterSync:
    """The outer loop of one front end (module doc).

    ``driver``: the front end's :class:`StepDriver` (its engine exchanges the pseudo-gradients,
    its per-tensor states keep the error-feedback residuals); ``named``: ``(name, flat
    parameter)`` of every tensor synced, whose values now are the first anchor; ``copy(t)``: a
    copy of a tensor on its device (the anchor must not alias the parameter).
    """

    def __init__(self, driver: StepDriver, ops: Ops, settings: OuterSettings,
                 named: Iterable[Tuple[str, Tensor]], copy: Callable[[Tensor], Tensor]):
        self.driver, self.ops, self.settings = driver, ops, settings
        self.outer: Dict[str, dict] = {}
        for name, x in sorted(named, key=lambda item: item[0]):
            self.outer[name] = {"anchor": copy(x), "momentum": ops.zeros(ops.numel(x), like=x)}
        #: bytes a data-parallel step would send: every synced tensor once
        self.dense_per_step = sum(ops.numel(s["anchor"]) * ops.element_size(s["anchor"])
                                  for s in self.outer.values())
        self.step = 0      # inner steps taken (checkpointed)
        self.counted = 0   # inner steps since construction (the bytes)

    def agree(self, params: Sequence[Tuple[str, tuple, str]], like: Tensor, parameters: bool = True) -> None:
        """Fail on every rank, naming the difference, if ranks differ in the tensors ``params``
        (``(name, shape, dtype)`` of every synced tensor), the compressor, the outer settings or,
        with ``parameters``, the starting parameters (their checksums): a collective, at
        construction (and after an elastic rebuild)."""
        anchors = [s["anchor"] for s in self.outer.values()] if parameters else []
        sums = [int(v) for v in self.ops.to_numpy(self.ops.checksums(anchors))] if anchors else []
        self.driver.agree(params, like, **self.settings.agreement(), parameters=sums)

    def after_inner_step(self) -> bool:
        """Count an inner step; whether the outer sync is due now."""
        self.step += 1
        self.counted += 1
        return self.step % self.settings.sync_every == 0

    def sync(self, current: Sequence[Tuple[str, Tensor, TensorInfo]]) -> List[Tuple[str, Tensor]]:
        """The outer sync: ``current`` holds ``(name, flat parameter, info)`` of every synced
        tensor, in any order; returns ``(name, new anchor)`` in name order, to be written into
        the parameters. A collective: every rank calls it at the same step."""
        driver = self.driver
        entries = [driver.compress(name, self.outer[name]["anchor"] - x, info)
                   for name, x, info in sorted(current, key=lambda item: item[0])]
        driver.start(entries)
        done = driver.finish()
        driver.end_exchange()
        driver.end_update()
        return [(e.info.name, outer_step(self.ops, self.outer[e.info.name], e.total, self.settings))
                for e in done]

    @property
    def total_bytes(self) -> ByteCount:
        """Since construction: ``sent``, this rank's payloads of the outer syncs; ``dense``,
        what every-step data parallelism would have sent over the same inner steps."""
        return ByteCount(dense=self.dense_per_step * self.counted, sent=self.driver.total_bytes.sent,
                         steps=self.counted)

    # ---- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self, host: Callable[[Tensor], Any]) -> dict:
        """The step counter and every tensor's anchor and momentum (``host(t)``: a copy to keep)."""
        return {"step": self.step, "outer": {n: {k: host(v) for k, v in s.items()} for n, s in self.outer.items()}}

    def load_state_dict(self, saved: Mapping, copy: Callable[[Any, Tensor], Tensor]) -> None:
        """Load :meth:`state_dict`'s output (``copy(v, like)``: ``v`` on ``like``'s device).
        The tensors must be the same, by name and size; local, no collective."""
        outer = saved["outer"]
        if sorted(outer) != sorted(self.outer):
            differ = sorted(set(outer) ^ set(self.outer))[:5]
            raise ValueError(f"load_state_dict: the checkpoint's tensors differ from this run's: {differ}")
        for name, state in self.outer.items():
            for key in ("anchor", "momentum"):
                value = copy(outer[name][key], state[key])
                if self.ops.numel(value) != self.ops.numel(state[key]):
                    raise ValueError(f"load_state_dict: '{name}' {key} has {self.ops.numel(value)} "
                                     f"elements, this run's {self.ops.numel(state[key])}")
                state[key] = value
        self.step = int(saved["step"])
