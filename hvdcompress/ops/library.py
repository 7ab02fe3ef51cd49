"""The compiled kernel library ``hvdcompress/ops/_kernels*.so``: found (:func:`library_path`),
loaded once with its C functions' ctypes signatures and checked against the kernel table
(:func:`load`), and called (:func:`call`). capi.cpp exports the kernels as a plain C ABI and
lists them with their argument types; ctypes releases the GIL for the duration of each call.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import os
from typing import Any, Callable, Dict, Iterable, Tuple

from . import table

_LIB: dict = {}
#: ctypes types of the argument codes in the library's kernel list (Python struct letters).
_CTYPES = {"P": ctypes.c_void_p, "?": ctypes.c_bool, "i": ctypes.c_int, "I": ctypes.c_uint32,
           "q": ctypes.c_int64, "f": ctypes.c_float, "d": ctypes.c_double}
_ERRORS = {1: ValueError, 2: IndexError}
#: The argument code of a returned value of each dtype.
_CODES = {"float32": "f", "float64": "d", "int64": "q", "int32": "i"}


def library_path() -> str:
    """The path of the compiled kernel library (``_kernels`` + the extension-module suffix)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_kernels" + suffix)
        if os.path.exists(path):
            return path
    raise ImportError(f"the C++ kernel library hvdcompress/ops/_kernels*.so is not built (looked in "
                      f"{here}); build it with `pip install --no-build-isolation -e .`")


class _Entry(ctypes.Structure):
    """capi.cpp's ``hvdc_kernel``: a C function of the library with its argument codes."""
    _fields_ = [("name", ctypes.c_char_p), ("signature", ctypes.c_char_p), ("function", ctypes.c_void_p)]


def load() -> Dict[str, Callable[..., int]]:
    """The kernel library's C functions by name, with their ctypes signatures (loaded once);
    ImportError when it is not built or does not export exactly the C functions of
    :data:`hvdcompress.ops.table.C_FUNCTIONS` (a library built from other sources)."""
    if "functions" not in _LIB:
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
            listing = lib.hvdc_kernels
        except (OSError, AttributeError) as exc:
            raise ImportError(f"could not load the C++ kernel library {path}: {exc}") from exc
        listing.argtypes, listing.restype = [ctypes.POINTER(ctypes.c_int64)], ctypes.POINTER(_Entry)
        lib.hvdc_error.restype = ctypes.c_char_p
        count = ctypes.c_int64()
        exported = {e.name.decode(): e for e in listing(ctypes.byref(count))[:count.value]}
        signatures = {name: e.signature.decode().partition(">") for name, e in exported.items()}
        check_exports(exported, path)
        check_calls(signatures, path)
        _LIB["lib"], _LIB["signatures"] = lib, signatures
        _LIB["functions"] = {
            name: ctypes.CFUNCTYPE(ctypes.c_int, *(_CTYPES[c] for c in args),
                                   *([ctypes.c_void_p] if result else []))(exported[name].function)
            for name, (args, _, result) in signatures.items()}
    return _LIB["functions"]


def check_exports(exported: Iterable[str], path: str) -> None:
    """ImportError unless the library at ``path`` exports exactly the table's C functions."""
    missing, extra = set(table.C_FUNCTIONS) - set(exported), set(exported) - set(table.C_FUNCTIONS)
    if missing or extra:
        raise ImportError(f"the C++ kernel library {path} does not match hvdcompress/ops/table.py "
                          f"(missing: {sorted(missing)}, not declared: {sorted(extra)}); rebuild "
                          "it with `pip install --no-build-isolation -e .`")


def check_calls(signatures: Dict[str, Tuple[str, str, str]], path: str) -> None:
    """ImportError unless the C function of every kernel with a declared C call takes that call:
    as many arguments, addresses exactly where the call passes arrays, and a returned value of
    the declared result's dtype (``signatures``: argument codes, ">", the returned value's)."""
    for kernel in table.KERNELS.values():
        if kernel.c is None:
            continue
        args, _, result = signatures[kernel.exports[0]]
        returned = kernel.c[-1][1:] if kernel.c[-1].startswith("&") else None
        want = ["P" if kernel.is_pointer(a) else "-" for a in kernel.c if a != f"&{returned}"]
        got = ["P" if code == "P" else "-" for code in args]
        want_result = _CODES[kernel.result(returned).dtype] if returned else ""
        if got != want or result != want_result:
            raise ImportError(f"the C++ kernel library {path} does not match hvdcompress/ops/table.py: "
                              f"{kernel.name} takes {args!r} and returns {result or 'nothing'}; the "
                              f"table's call ({', '.join(kernel.c)}) needs {''.join(want)!r}"
                              f"{' and ' + want_result if want_result else ''}; rebuild the library")


def call(name: str, *args: Any) -> None:
    """Call the C function ``name``; its error status raised as ValueError, IndexError or
    RuntimeError with the library's message."""
    status = load()[name](*args)
    if status:
        raise _ERRORS.get(status, RuntimeError)(_LIB["lib"].hvdc_error().decode())
