"""Build a compressor from a dict of strings, BytePS style::

    from_params({"compressor": "randomk", "k": "0.01", "ef": "vanilla",
                 "momentum": "nesterov", "seed": "7"})

Values may be strings (as from a command line or a config file; a bool is ``true``/``false``,
``1``/``0``, ``yes``/``no`` or ``on``/``off``) or typed. Keys:

* ``compressor``: a registered name (:func:`available`).
* the compressor's own constructor arguments, converted by their type hints.
* ``ef``: ``"none"`` or ``"vanilla"`` (wrap in :class:`~hvdcompress.contract.memory.ErrorFeedback`).
* ``momentum``: ``"none"``, ``"plain"`` or ``"nesterov"`` (wrap in
  :class:`~hvdcompress.contract.memory.Momentum`), with ``momentum_mu`` (default: the optimizer's).
  For compressors with momentum built in (DGC) it sets their ``nesterov`` instead of wrapping,
  and ``momentum_mu`` their ``momentum``.
* ``adam``: ``"none"`` or ``"frozen"`` (wrap in :class:`~hvdcompress.adam.frozen.FrozenAdam`, outermost:
  the Adam/AdamW take-over), with ``freeze_steps`` (default: none, v refreshed at growing intervals, :mod:`hvdcompress.adam.variance`),
  ``adam_send``: what is compressed in the compressed steps, ``"auto"`` (default: ``"preconditioned"``
  around top-k, else ``"gradient"``), ``"gradient"``, ``"momentum"`` or ``"preconditioned"``,
  and ``adam_warmup``: what sends the gradient while v is updated, ``"auto"`` (default: int8;
  int4 in the long warm-up), ``"int8"``, ``"int4"`` or ``"none"`` (dense), and
  ``adam_live_steps``: the steps of live Adam before the refreshes of v begin (default: the long
  warm-up, 512, at b2 > 0.998 around top-k, PowerSGD and onebit from 4 ranks,
  :func:`~hvdcompress.adam.variance.long_warmup`; else 256 around top-k and random-k, else
  :data:`~hvdcompress.adam.variance.WARMUP`), and ``adam_min_numel``:
  tensors with fewer elements run live Adam at every step (default: :data:`hvdcompress.adam.frozen.MIN_NUMEL`).
  Around onebit it makes ``chunk="auto"`` (onebit's default) a scale per row (``"rows"``); give
  ``chunk="none"`` for one scale per tensor.
* ``seed``: a parameter of the compressors that draw random numbers (randomk, dithering, ...);
  with any other it is an unknown key, an error. BytePS's ``byteps_seed``, which its trainer sets
  on every tensor whatever the compressor, is checked (an integer >= 0) and unused by those.
* ``compressor="auto"``: :class:`hvdcompress.auto.Auto`, which picks one of the others per
  tensor; keys ``allowed`` (``"none,fp16,int8"``), ``link`` (``"10gbit,50us"``),
  ``calibration``, ``replan``; no decorator or warm-up keys. It registers itself as a planner
  (``register(Auto, planner=True)``, on ``import hvdcompress``): not listed by :func:`available`.

BytePS's keys are read as the same keys, so a BytePS config works unchanged:

* its prefixed spelling (:data:`BYTEPS_KEYS`): ``byteps_compressor_type`` (compressor),
  ``byteps_compressor_k`` (k), ``byteps_error_feedback_type`` or ``byteps_ef_type`` (ef),
  ``byteps_momentum_type`` (momentum), ``byteps_momentum_mu``, ``byteps_seed``,
  ``byteps_compressor_onebit_scaling`` (scaling);
* its generic ``k`` and ``scaling`` where a compressor names them otherwise
  (:data:`BYTEPS_PARAMS`): ``k`` is the ``levels`` of dithering and qsgd, ``scaling`` the
  ``scale`` of onebit (whose default here is True; BytePS's is false).

Two keys that give the same value (``k`` and ``levels``, ``compressor`` and
``byteps_compressor_type``) are an error naming both.

Sparsity warm-up of the compressors that take a ``warmup`` schedule (DGC, CSC), from strings
(:data:`WARMUP_KEYS`; one of the three forms; ``s`` is the compressor's target sparsity):

* ``warmup_epochs=N`` (``warmup_steps=N``): the DGC paper's exponential ramp over ``N`` epochs
  (steps) below the target, then the target: density ``(1 - s) ** ((t + 1) / (N + 1))`` at
  ``t < N``, which is :class:`~hvdcompress.contract.schedule.ExponentialWarmup` ``(N + 1)``; for
  ``s = 0.999`` and ``N = 4``: 74.9%, 93.7%, 98.4%, 99.6%, then 99.9%. ``N = 0``: no warm-up.
* ``warmup_sparsities="0.75,0.9375,0.984375,0.996"`` with ``warmup_unit`` ``"epoch"`` (default)
  or ``"step"``: one entry per unit, then the target
  (:class:`~hvdcompress.contract.schedule.ListWarmup` with ``to_target=True``). With Paddle's
  ``rampup_begin_step=B`` and ``rampup_step=L`` (steps): dense before step ``B``, the list
  walked evenly over ``L`` steps, then the target.

Errors are ``ValueError`` naming the key (as given), the value and what is allowed.
"""
from __future__ import annotations

import inspect
import typing
from typing import Any, Dict, Mapping, Optional, Type

from .adam.frozen import SEND, FrozenAdam
from .adam.frozen import WARMUP as ADAM_WARMUP
from .contract.compressor import Compressor
from .contract.memory import ErrorFeedback, Momentum
from .contract.schedule import ExponentialWarmup, ListWarmup, Schedule
from .contract.validation import check_choice, check_int

_REGISTRY: Dict[str, Type[Compressor]] = {}
#: The registered planners over the algorithms (``"auto"``): buildable, not in :func:`available`.
_PLANNERS: set = set()
DECORATOR_KEYS = ("ef", "momentum", "momentum_mu", "adam", "freeze_steps", "adam_send", "adam_warmup", "adam_live_steps", "adam_min_numel")
#: BytePS's prefixed spelling of the keys (its tensor attributes) -> this registry's key.
BYTEPS_KEYS: Dict[str, str] = {
    "byteps_compressor_type": "compressor", "byteps_compressor_k": "k",
    "byteps_error_feedback_type": "ef", "byteps_ef_type": "ef",
    "byteps_momentum_type": "momentum", "byteps_momentum_mu": "momentum_mu",
    "byteps_seed": "seed", "byteps_compressor_onebit_scaling": "scaling"}
#: BytePS's generic keys that a compressor names otherwise: {compressor: {BytePS key: parameter}}.
BYTEPS_PARAMS: Dict[str, Dict[str, str]] = {
    "dithering": {"k": "levels"}, "qsgd": {"k": "levels"}, "onebit": {"scaling": "scale"}}
WARMUP_FORMS = ("warmup_epochs", "warmup_steps", "warmup_sparsities")
WARMUP_KEYS = WARMUP_FORMS + ("warmup_unit", "rampup_begin_step", "rampup_step")
_RAMP_UNITS = {"warmup_epochs": "epoch", "warmup_steps": "step"}
#: The spellings of a bool in a string dict.
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
          "on": True, "off": False}
AUTO = "auto"   # compressor="auto": hvdcompress.auto.Auto (a planner) picks one of the others per tensor


def _compressor_class(name: str, key: str) -> Type[Compressor]:
    """The class registered as ``name`` (an algorithm, or a planner such as ``"auto"``)."""
    if name not in _REGISTRY:
        raise ValueError(f"from_params: {key}={name!r} is unknown; allowed: "
                         f"{', '.join(available() + sorted(_PLANNERS))}")
    return _REGISTRY[name]


def register(cls: Type[Compressor], planner: bool = False) -> Type[Compressor]:
    """Class decorator: make ``cls`` buildable by its ``name``. ``planner``: ``cls`` picks one
    of the algorithms per tensor (:class:`hvdcompress.auto.Auto`): not listed by
    :func:`available`, and it takes no decorator or warm-up keys."""
    _REGISTRY[cls.name] = cls
    if planner:
        _PLANNERS.add(cls.name)
    else:
        _PLANNERS.discard(cls.name)
    return cls


def is_planner(compressor: Compressor) -> bool:
    """Whether ``compressor`` is a registered planner (it picks each tensor's algorithm and
    collective itself, so it takes no ``collective=`` or ``intra_node=``)."""
    return type(compressor).name in _PLANNERS and _REGISTRY.get(type(compressor).name) is type(compressor)


def planner_from_arguments(compression: Any, allowed: Any = None, link: Any = None) -> Optional[Compressor]:
    """The front ends' ``compression="auto"`` with their ``auto_allowed=`` and ``link=``: the
    registered planner built from them; None for any other ``compression`` (which then takes
    neither argument: the planner's ``from_arguments`` says so)."""
    if AUTO not in _REGISTRY:
        raise ValueError(f"compression={compression!r}: no planner is registered as {AUTO!r} "
                         "(import hvdcompress registers hvdcompress.auto.Auto)")
    return _REGISTRY[AUTO].from_arguments(compression, allowed, link)


def available() -> list:
    """The registered compressor names (the algorithms; planners such as ``"auto"`` are not listed)."""
    return sorted(set(_REGISTRY) - _PLANNERS)


def _convert(key: str, value: Any, hint: Any) -> Any:
    """``value`` converted to the constructor's type hint (strings parsed)."""
    if not isinstance(value, str):
        return value
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    text = value.strip()
    if text.lower() == "none" and type(None) in typing.get_args(hint):
        return None
    for kind in args:  # Union[int, float]: "100" is a count, "0.01" a fraction
        try:
            if kind is bool:
                if text.lower() in _BOOLS:
                    return _BOOLS[text.lower()]
                raise ValueError
            if kind in (int, float, str):
                return kind(text)
        except ValueError:
            continue
    names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
    spellings = f"; allowed: {', '.join(_BOOLS)}" if bool in args else ""
    raise ValueError(f"from_params: {key}={value!r} cannot be read as {names}{spellings}")


def _signature(cls: Type[Compressor]) -> Dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _rename(params: Dict[str, Any], spelled: Dict[str, str], aliases: Mapping[str, str],
            owner: str) -> None:
    """Rename, in place, the keys of ``params`` that ``aliases`` maps (alias -> key);
    ``spelled`` follows every key to the spelling the caller gave."""
    for alias, key in aliases.items():
        if alias not in params:
            continue
        if key in params:
            raise ValueError(f"from_params: keys {spelled[key]!r} and {spelled[alias]!r} both "
                             f"give {owner}{key}; give only one of them")
        params[key] = params.pop(alias)
        spelled[key] = spelled.pop(alias)


def _count(key: str, value: Any, low: int) -> int:
    return check_int("from_params", key, _convert(key, value, int), low)


def _sparsities(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    try:
        return [float(s) for s in value.split(",")]
    except (AttributeError, ValueError):
        raise ValueError(f"from_params: warmup_sparsities={value!r} cannot be read as numbers; "
                         "allowed: comma-separated numbers, e.g. '0.75,0.9375,0.984375,0.996'"
                         ) from None


def _warmup(given: Dict[str, Any]) -> Optional[Schedule]:
    """The schedule that the warm-up keys ``given`` describe (see the module doc)."""
    forms = [k for k in WARMUP_FORMS if k in given]
    if len(forms) > 1:
        raise ValueError(f"from_params: keys {forms[0]!r} and {forms[1]!r} both give the "
                         "warm-up; give only one of them")
    if not forms or forms[0] in _RAMP_UNITS:
        extra = next((k for k in given if k not in WARMUP_FORMS), None)
        if extra is not None:
            raise ValueError(f"from_params: {extra}={given[extra]!r} goes with "
                             f"warmup_sparsities, which is not given")
        length = _count(forms[0], given[forms[0]], 0)
        return ExponentialWarmup(length + 1, unit=_RAMP_UNITS[forms[0]]) if length else None
    text = given["warmup_sparsities"]
    sparsities = _sparsities(text)
    rampup = [k for k in ("rampup_begin_step", "rampup_step") if k in given]
    unit = check_choice("from_params", "warmup_unit",
                        given.get("warmup_unit", "step" if rampup else "epoch"), ("epoch", "step"))
    if rampup and unit != "step":
        raise ValueError(f"from_params: warmup_unit={unit!r} with {rampup[0]}, which counts "
                         "steps; allowed: 'step'")
    begin = _count("rampup_begin_step", given.get("rampup_begin_step", 0), 0)
    length = _count("rampup_step", given.get("rampup_step", len(sparsities)), 1)
    try:
        return ListWarmup(sparsities, begin=begin, length=length, unit=unit, to_target=True)
    except ValueError as error:
        raise ValueError(f"from_params: warmup_sparsities={text!r}: {error}") from None


def from_params(params: Mapping[str, Any]) -> Compressor:
    """Build a compressor (with its memory decorators) from ``params``; see the module doc."""
    if not isinstance(params, Mapping):
        named = isinstance(params, str) and params in _REGISTRY
        hint = f" such as {{'compressor': {params!r}}}" if named else ""
        raise TypeError(f"from_params: params={params!r} is not a mapping; allowed: a dict{hint} "
                        "of keys and values (see hvdcompress.registry)")
    given = dict(params)
    spelled = {k: k for k in given}
    _rename(given, spelled, BYTEPS_KEYS, "")
    name = given.pop("compressor", None)
    if name is None:
        raise ValueError(f"from_params: key 'compressor' is missing; allowed: {', '.join(available())}")
    cls = _compressor_class(name, spelled["compressor"])
    if name in _PLANNERS:
        extra = next((k for k in (*DECORATOR_KEYS, "seed", *WARMUP_KEYS) if k in given), None)
        if extra is not None:
            raise ValueError(f"from_params: {spelled[extra]}={given[extra]!r} with compressor={name!r}: "
                             f"{name} picks each tensor's compressor; allowed keys: compressor, "
                             f"{', '.join(_signature(cls))} (list e.g. 'onebit+ef' in allowed)")
    _rename(given, spelled, BYTEPS_PARAMS.get(name, {}), f"{name}'s ")
    ef = given.pop("ef", "none")
    momentum = given.pop("momentum", "none")
    mu = given.pop("momentum_mu", None)
    adam = given.pop("adam", "none")
    freeze = given.pop("freeze_steps", None)
    send = given.pop("adam_send", None)
    adam_warmup = given.pop("adam_warmup", None)
    live = given.pop("adam_live_steps", None)
    small = given.pop("adam_min_numel", None)
    for key, value in (("adam_live_steps", live), ("adam_warmup", adam_warmup), ("freeze_steps", freeze),
                       ("adam_send", send), ("adam_min_numel", small)):
        if value is not None and adam == "none":
            raise ValueError(f"from_params: {spelled[key]}={value!r} without adam; allowed: with adam 'frozen'")
    live = None if live is None else _count(spelled["adam_live_steps"], live, 1)
    small = None if small is None else _count(spelled["adam_min_numel"], small, 0)
    if adam_warmup is not None and adam_warmup not in ADAM_WARMUP:
        raise ValueError(f"from_params: {spelled['adam_warmup']}={adam_warmup!r} is unknown; allowed: "
                         f"{', '.join(map(repr, ADAM_WARMUP))}")
    if adam not in ("none", "frozen"):
        raise ValueError(f"from_params: {spelled['adam']}={adam!r} is unknown; allowed: 'none', 'frozen'")
    if send is not None and send not in SEND:
        raise ValueError(f"from_params: {spelled['adam_send']}={send!r} is unknown; allowed: "
                         f"{', '.join(map(repr, SEND))}")
    freeze = None if freeze is None else _count(spelled["freeze_steps"], freeze, 0)
    if ef not in ("none", "vanilla"):
        raise ValueError(f"from_params: {spelled['ef']}={ef!r} is unknown; allowed: 'none', 'vanilla'")
    if momentum not in ("none", "plain", "nesterov"):
        raise ValueError(f"from_params: {spelled['momentum']}={momentum!r} is unknown; allowed: "
                         "'none', 'plain', 'nesterov'")
    if mu is not None and momentum == "none":
        raise ValueError(f"from_params: {spelled['momentum_mu']}={mu!r} without momentum; "
                         "allowed: with momentum 'plain' or 'nesterov'")
    mu = None if mu is None else _convert(spelled["momentum_mu"], mu, float)
    sig = _signature(cls)
    if "seed" not in sig and spelled.get("seed") == "byteps_seed":  # BytePS sets it on every tensor
        _count("byteps_seed", given.pop("seed"), 0)

    warmup_keys = WARMUP_KEYS if "warmup" in sig else ()
    warmup = {k: given.pop(k) for k in warmup_keys if k in given}
    if warmup:
        if "warmup" in given:
            raise ValueError(f"from_params: keys 'warmup' and {next(iter(warmup))!r} both give "
                             "the warm-up; give only one of them")
        given["warmup"] = _warmup(warmup)
    elif isinstance(given.get("warmup"), str) and given["warmup"].strip().lower() != "none":
        raise ValueError(f"from_params: warmup={given['warmup']!r} is a string; allowed: a "
                         "Schedule, or warmup_epochs=N, warmup_steps=N or "
                         "warmup_sparsities=s0,s1,... (with warmup_unit, rampup_begin_step, "
                         "rampup_step)")
    hints = typing.get_type_hints(cls.__init__)
    if cls.takes_over_momentum and "nesterov" in sig:
        if momentum != "none":
            given["nesterov"] = momentum == "nesterov"
            given["momentum"] = mu
            momentum = "none"
        if ef != "none":
            raise ValueError(f"from_params: {spelled['ef']}={ef!r} with compressor={name!r}: "
                             f"{name} keeps its own residual; allowed: 'none'")
    kwargs = {}
    for key, value in given.items():
        if key not in sig:
            allowed = ", ".join(["compressor", *sig, *DECORATOR_KEYS, *warmup_keys,
                                 *BYTEPS_PARAMS.get(name, {})])
            raise ValueError(f"from_params: key {spelled[key]!r} (value {value!r}) is not a "
                             f"parameter of {name}; allowed keys: {allowed}")
        kwargs[key] = _convert(spelled.get(key, key), value, hints.get(key, str))
    missing = [k for k, p in sig.items() if p.default is inspect.Parameter.empty and k not in kwargs]
    if missing:
        raise ValueError(f"from_params: {name} needs {', '.join(missing)}, which is missing")
    renamed = [f"{spelled[k]!r} as {k!r}" for k in kwargs if spelled.get(k, k) != k]
    try:
        compressor: Compressor = cls(**kwargs)
    except ValueError as error:
        if not renamed:
            raise
        raise ValueError(f"{error} (from_params read {', '.join(renamed)})") from None
    if ef == "vanilla":
        compressor = ErrorFeedback(compressor)
    if momentum != "none":
        compressor = Momentum(compressor, mu=mu, nesterov=momentum == "nesterov")
    if adam == "frozen":
        compressor = FrozenAdam(compressor, freeze_steps=freeze, send=send or SEND[0],
                                warmup=adam_warmup or ADAM_WARMUP[0], live_steps=live, min_numel=small)
    return compressor


def parse_params(text: str) -> Dict[str, str]:
    """A command-line flag ``"key=value,key=value"`` as a dict for :func:`from_params`. A piece
    without ``=`` continues the value before it, so lists pass whole:
    ``"compressor=dgc,warmup_sparsities=0.75,0.9375,warmup_unit=step"``."""
    params: Dict[str, str] = {}
    key = None
    for piece in text.split(","):
        if "=" in piece:
            key, value = (s.strip() for s in piece.split("=", 1))
            if not key or key in params:
                raise ValueError(f"parse_params: {text!r}: key {key!r} is empty or given twice; "
                                 "allowed: key=value pairs separated by commas")
            params[key] = value
        elif key is None:
            raise ValueError(f"parse_params: {text!r} starts with {piece!r}; allowed: key=value "
                             "pairs separated by commas")
        else:
            params[key] += "," + piece.strip()
    return params


#: Horovod's own ``hvd.Compression.none`` / ``.fp16`` (torch, TensorFlow, Keras, MXNet) by class
#: name -> the registered name of the same compression.
HOROVOD_COMPRESSION = {"NoneCompressor": "none", "FP16Compressor": "fp16"}


def _horovod_compression(compression: Any) -> Optional[str]:
    """The registered name standing for Horovod's ``compression`` (its class or an instance),
    told by duck typing without importing Horovod: a class of a ``horovod.`` module named as in
    :data:`HOROVOD_COMPRESSION`. None for anything that is not Horovod's; a TypeError naming
    the replacement for a Horovod compressor without one."""
    cls = compression if isinstance(compression, type) else type(compression)
    if not cls.__module__.startswith("horovod."):
        return None
    if cls.__name__ not in HOROVOD_COMPRESSION:
        raise TypeError(f"compression={compression!r} is a Horovod compressor other than "
                        "hvd.Compression.none and hvd.Compression.fp16 (which map to "
                        "hvdcompress.NoCompression() and hvdcompress.FP16()); allowed: an "
                        "hvdcompress Compressor, e.g. a dict {'compressor': name} of a name in "
                        "hvdcompress.available()")
    return HOROVOD_COMPRESSION[cls.__name__]


def as_compressor(compression: Any) -> Compressor:
    """What the framework wrappers accept as ``compression=``: a Compressor, a dict for
    :func:`from_params`, ``"auto"`` (:class:`hvdcompress.auto.Auto`), None (no compression), or
    Horovod's ``hvd.Compression.none`` / ``hvd.Compression.fp16``, left in place by a migration
    (NoCompression() and FP16(); :func:`_horovod_compression`)."""
    from .compressors.none import NoCompression

    if isinstance(compression, str) and compression == AUTO:
        return from_params({"compressor": AUTO})
    if compression is None:
        return NoCompression()
    if isinstance(compression, Compressor):
        return compression
    if isinstance(compression, Mapping):
        return from_params(compression)
    horovod = _horovod_compression(compression)
    if horovod is not None:
        return from_params({"compressor": horovod})
    raise TypeError(f"compression={compression!r} is not supported; allowed: an hvdcompress "
                    "Compressor (e.g. hvdcompress.DGC(0.999), hvdcompress.FP16()), a dict for "
                    "hvdcompress.from_params, Horovod's hvd.Compression.none or "
                    "hvd.Compression.fp16, or None")
