"""Argument checks shared by all compressors: each error names the parameter, the value and
what is allowed. Numbers are ``numbers.Real`` / ``numbers.Integral`` (numpy scalars included),
never a bool; a bool is a bool (or ``numpy.bool_``), never a string or a number: strings are
parsed by :func:`hvdcompress.registry.from_params`, not here."""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Iterable, Optional

import numpy as np


def _fail(owner: str, key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{owner}: {key}={value!r} is out of range; allowed: {allowed}")


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer (a Python or numpy one; a bool is not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (a Python or numpy one; a bool is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_bool(owner: str, key: str, value: Any, none: bool = False) -> Optional[bool]:
    """A bool (``numpy.bool_`` included; None where ``none``): ``"false"`` or ``0`` is refused,
    not read as truthy."""
    if none and value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}: {key}={value!r} is not a bool; allowed: True or False"
                         + (" or None" if none else ""))
    return bool(value)


def check_range(owner: str, key: str, value: Any, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """A real number in [low, high] (ends open where asked)."""
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    allowed = f"a number in {lo}{low}, {high}{hi}"
    if not is_real(value) or math.isnan(value):
        _fail(owner, key, value, allowed)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        _fail(owner, key, value, allowed)
    return float(value)


def check_int(owner: str, key: str, value: Any, low: int, high: float = math.inf) -> int:
    """An integer in [low, high]."""
    if not is_integer(value) or not low <= value <= high:
        _fail(owner, key, value, f"an integer >= {low}" + ("" if high == math.inf else f" and <= {high}"))
    return int(value)


def check_choice(owner: str, key: str, value: Any, choices: Iterable[str]) -> str:
    choices = list(choices)
    if value not in choices:
        _fail(owner, key, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def env_number(variable: str, default: Any, kind: Callable[[str], Any], allowed: str) -> Any:
    """The environment variable ``variable`` (``default`` where unset) as ``kind`` (int or float),
    which must be >= 0; else a ValueError naming it, its text and ``allowed``."""
    text = os.environ.get(variable, str(default))
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value >= 0:
        raise ValueError(f"{variable}={text!r}: allowed: {allowed}")
    return value
