"""Argument checks shared by all compressors: each error names the parameter, the value and
what is allowed."""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable


def _fail(owner: str, key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{owner}: {key}={value!r} is out of range; allowed: {allowed}")


def check_range(owner: str, key: str, value: Any, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """A real number in [low, high] (ends open where asked)."""
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    allowed = f"a number in {lo}{low}, {high}{hi}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        _fail(owner, key, value, allowed)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        _fail(owner, key, value, allowed)
    return float(value)


def check_int(owner: str, key: str, value: Any, low: int, high: float = math.inf) -> int:
    """An integer in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
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
