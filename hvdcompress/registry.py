"""Build a compressor from a dict of strings, BytePS style::

    from_params({"compressor": "topk", "k": "0.01", "ef": "vanilla",
                 "momentum": "nesterov", "seed": "7"})

Values may be strings (as from a command line or a config file) or typed. Keys:

* ``compressor``: a registered name (:func:`available`).
* the compressor's own constructor arguments, converted by their type hints.
* ``ef``: ``"none"`` or ``"vanilla"`` (wrap in :class:`~hvdcompress.memory.ErrorFeedback`).
* ``momentum``: ``"none"``, ``"plain"`` or ``"nesterov"`` (wrap in
  :class:`~hvdcompress.memory.Momentum`), with ``momentum_mu`` (default: the optimizer's).
  For compressors with momentum built in (DGC) it sets their ``nesterov`` instead of wrapping,
  and ``momentum_mu`` their ``momentum``.
* ``seed``: the seed of compressors that draw random numbers; checked and unused by the others.

Errors are ``ValueError`` naming the key, the value and what is allowed.
"""
from __future__ import annotations

import inspect
import typing
from typing import Any, Dict, Mapping, Type

from .compressor import Compressor
from .memory import ErrorFeedback, Momentum

_REGISTRY: Dict[str, Type[Compressor]] = {}
DECORATOR_KEYS = ("ef", "momentum", "momentum_mu", "seed")


def register(cls: Type[Compressor]) -> Type[Compressor]:
    """Class decorator: make ``cls`` buildable by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list:
    """The registered compressor names."""
    return sorted(_REGISTRY)


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
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if kind in (int, float, str):
                return kind(text)
        except ValueError:
            continue
    names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
    raise ValueError(f"from_params: {key}={value!r} cannot be read as {names}")


def _signature(cls: Type[Compressor]) -> Dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def from_params(params: Mapping[str, Any]) -> Compressor:
    """Build a compressor (with its memory decorators) from ``params``; see the module doc."""
    params = dict(params)
    name = params.pop("compressor", None)
    if name is None:
        raise ValueError(f"from_params: key 'compressor' is missing; allowed: {', '.join(available())}")
    if name not in _REGISTRY:
        raise ValueError(f"from_params: compressor={name!r} is unknown; allowed: {', '.join(available())}")
    cls = _REGISTRY[name]
    ef = params.pop("ef", "none")
    momentum = params.pop("momentum", "none")
    mu = params.pop("momentum_mu", None)
    if ef not in ("none", "vanilla"):
        raise ValueError(f"from_params: ef={ef!r} is unknown; allowed: 'none', 'vanilla'")
    if momentum not in ("none", "plain", "nesterov"):
        raise ValueError(f"from_params: momentum={momentum!r} is unknown; allowed: 'none', 'plain', 'nesterov'")
    mu = None if mu is None else _convert("momentum_mu", mu, float)
    if "seed" in params and "seed" not in _signature(cls):
        _convert("seed", params.pop("seed"), int)  # deterministic compressors draw nothing

    sig = _signature(cls)
    hints = typing.get_type_hints(cls.__init__)
    if cls.takes_over_momentum and "nesterov" in sig:
        if momentum != "none":
            params["nesterov"] = momentum == "nesterov"
            params["momentum"] = mu
            momentum = "none"
        if ef != "none":
            raise ValueError(f"from_params: ef={ef!r} with compressor={name!r}: {name} keeps its "
                             "own residual; allowed: 'none'")
    kwargs = {}
    for key, value in params.items():
        if key not in sig:
            allowed = ", ".join(["compressor", *sig, *DECORATOR_KEYS])
            raise ValueError(f"from_params: key {key!r} (value {value!r}) is not a parameter of "
                             f"{name}; allowed keys: {allowed}")
        kwargs[key] = _convert(key, value, hints.get(key, str))
    missing = [k for k, p in sig.items() if p.default is inspect.Parameter.empty and k not in kwargs]
    if missing:
        raise ValueError(f"from_params: {name} needs {', '.join(missing)}, which is missing")
    compressor: Compressor = cls(**kwargs)
    if ef == "vanilla":
        compressor = ErrorFeedback(compressor)
    if momentum != "none":
        compressor = Momentum(compressor, mu=mu, nesterov=momentum == "nesterov")
    return compressor


def as_compressor(compression: Any) -> Compressor:
    """What the framework wrappers accept as ``compression=``: a Compressor, a dict for
    :func:`from_params`, or None (no compression)."""
    from .compressors.none import NoCompression

    if compression is None:
        return NoCompression()
    if isinstance(compression, Compressor):
        return compression
    if isinstance(compression, Mapping):
        return from_params(compression)
    raise TypeError(f"compression={compression!r} is not supported; allowed: an hvdcompress "
                    "Compressor (e.g. hvdcompress.DGC(0.999), hvdcompress.FP16()), a dict for "
                    "hvdcompress.from_params, or None")
