"""The roles of the kernel table's parameters: what an argument must be.

A kernel's parameter in :mod:`hvdcompress.ops.table` is annotated with its role. A role's
``check`` raises the user-facing error for a wrong argument (TypeError for a dtype, ValueError for
a shape, a size or a range) and returns the argument as the kernel takes it. It works on any
array type through ``arrays``, an object with ``dtype`` (a numpy-style name), ``ndim``,
``numel``, ``is_contiguous`` and ``contiguous``: :class:`hvdcompress.ops.facade.Ops` on tensors,
native's adapter on numpy arrays. It records the sizes it defines (``n``, ``ranks``) in ``env``,
which holds the arguments checked before it: a role runs after the parameters it ``needs``.
Sizes are Python expressions of the arguments, ``n``, ``ranks``, :func:`packed_bytes` and
:func:`cdiv`.
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Mapping, Optional, Tuple

from .layout import packed_bytes


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``."""
    return -(-a // b)


class Size:
    """A size expression (``"packed_bytes(n, bits)"``), evaluated on the checked arguments."""

    def __init__(self, expression: str):
        self.expression = expression
        self.code = compile(expression, expression, "eval")
        self.names = {node.id for node in ast.walk(ast.parse(expression, mode="eval"))
                      if isinstance(node, ast.Name)} - set(_FUNCTIONS)

    def __call__(self, env: Mapping[str, Any]) -> int:
        return eval(self.code, _FUNCTIONS, dict(env))

    def __str__(self) -> str:
        return self.expression


_FUNCTIONS = {"packed_bytes": packed_bytes, "cdiv": cdiv}


# ---- roles ------------------------------------------------------------------------------------
class Role:
    tensor = False  # whether the argument is an array (the C function gets its address)
    defines: Tuple[str, ...] = ()

    def needs(self) -> set:
        return set()

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        return value


class Vector(Role):
    """A contiguous 1-D float32 tensor: of ``n`` elements (it defines ``n``), or of as many as
    the parameter ``like``."""

    tensor = True

    def __init__(self, like: Optional[str] = None):
        self.like = like
        self.defines = () if like else ("n",)

    def needs(self) -> set:
        return {"n", self.like} if self.like else set()

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        flat_float32(arrays, name, value)
        size = arrays.numel(value)
        if self.like is None:
            env["n"] = size
        elif size != env["n"]:
            raise ValueError(f"{name} has {size} elements, {self.like} has {env['n']}")
        return value


def flat_float32(arrays: Any, name: str, value: Any) -> None:
    """TypeError unless ``value`` is float32, ValueError unless it is contiguous and 1-D."""
    if arrays.dtype(value) != "float32":
        raise TypeError(f"{name} must be a float32 tensor, got {arrays.dtype(value)}")
    if arrays.ndim(value) != 1 or not arrays.is_contiguous(value):
        raise ValueError(f"{name} must be a contiguous 1-D tensor, got a "
                         f"{'' if arrays.is_contiguous(value) else 'non-contiguous '}"
                         f"{arrays.ndim(value)}-D tensor")


class Out(Role):
    """An output buffer of the caller (a decoder's sum): a contiguous float32 tensor of ``n``
    elements, or None (a new one)."""

    tensor = True

    def needs(self) -> set:
        return {"n"}

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        flat_float32(arrays, name, value)
        if arrays.numel(value) != env["n"]:
            raise ValueError(f"{name} has {arrays.numel(value)} elements; {env['n']} are needed")
        return value


class Into(Out):
    """The buffer that receives the new value of the parameter ``target`` (a residual, a
    momentum): ``target`` itself on a backend that updates state in place, else None (a new
    one); None when ``target`` is."""

    def __init__(self, target: str):
        self.target = target

    def needs(self) -> set:
        return {"n", self.target}


class Payloads(Role):
    """The payloads of R ranks back to back, each of ``each`` elements of ``dtype`` (R >= 1; it
    defines ``ranks``); made contiguous."""

    tensor = True
    defines = ("ranks",)

    def __init__(self, dtype: str, each: str):
        self.dtype, self.each = dtype, Size(each)

    def needs(self) -> set:
        return self.each.names

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        value = _contiguous(arrays, name, value, self.dtype)
        count, each = arrays.numel(value), self.each(env)
        if each < 1 or count == 0 or count % each:
            raise ValueError(f"{name} has {count} elements, not a positive multiple of {each}")
        env["ranks"] = count // each
        return value


class Sized(Role):
    """A contiguous tensor of ``size`` elements of ``dtype`` (made contiguous)."""

    tensor = True

    def __init__(self, dtype: str, size: str):
        self.dtype, self.size = dtype, Size(size)

    def needs(self) -> set:
        return self.size.names

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        value = _contiguous(arrays, name, value, self.dtype)
        need = self.size(env)
        if arrays.numel(value) != need:
            given = ", ".join(f"{k}={env[k]}" for k in sorted(self.size.names))
            raise ValueError(f"{name} has {arrays.numel(value)} entries; {self.size} = {need} "
                             f"are needed ({given})")
        return value


def _contiguous(arrays: Any, name: str, value: Any, dtype: str) -> Any:
    """``value`` made contiguous, after checking its dtype."""
    if arrays.dtype(value) != dtype:
        raise TypeError(f"{name} must be a {dtype} tensor, got {arrays.dtype(value)}")
    value = arrays.contiguous(value)
    if not arrays.is_contiguous(value):
        raise ValueError(f"{name} must be contiguous")
    return value


class Count(Role):
    """An int in [``low``, ``high``]; ``high`` may be a size expression (``"n"``)."""

    def __init__(self, low: int, high: Any):
        self.low, self.high = low, Size(high) if isinstance(high, str) else high

    def needs(self) -> set:
        return self.high.names if isinstance(self.high, Size) else set()

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        high = self.high(env) if isinstance(self.high, Size) else self.high
        if not self.low <= value <= high:
            raise ValueError(f"{kernel}: {name}={value} is out of range; allowed: {self.low}..{high}")
        return int(value)


class Choice(Role):
    """One of ``values`` (ints)."""

    def __init__(self, *values: int):
        self.values = values

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        if value not in self.values:
            raise ValueError(f"{kernel}: {name}={value} is out of range; allowed: "
                             f"{', '.join(map(str, self.values))}")
        return int(value)


class Converted(Role):
    """Any value, converted with ``to`` (int, bool, float)."""

    def __init__(self, to: Callable[[Any], Any]):
        self.to = to

    def check(self, arrays: Any, kernel: str, name: str, value: Any, env: dict) -> Any:
        return self.to(value)


class Scalar(Role):
    """A number, or a 0-d / 1-element tensor on the data's device: kept there for an
    implementation with ``DEVICE_SCALARS``, else read as a Python float."""


KEY = Count(0, 2 ** 32 - 1)  # seeds the counter-based uniforms of kernels.h
INT, FLAG, NUMBER = Converted(int), Converted(bool), Converted(float)
LENGTH = Count(1, 2 ** 62)  # an element count or a chunk length
#: The names the table's roles are written with.
ROLES = {"Vector": Vector, "Out": Out, "Into": Into, "Payloads": Payloads, "Sized": Sized,
         "Count": Count, "Choice": Choice, "Scalar": Scalar, "KEY": KEY, "INT": INT,
         "FLAG": FLAG, "NUMBER": NUMBER, "LENGTH": LENGTH}
