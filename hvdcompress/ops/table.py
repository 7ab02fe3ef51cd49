"""The kernel table: every kernel declared once, with the arguments its implementations take.

``kernels.h`` specifies what each kernel computes; this table says how Python calls it. An
implementation (:mod:`~hvdcompress.ops.native` on numpy arrays, :mod:`~hvdcompress.ops.torch_fallback`
and :mod:`~hvdcompress.ops.triton_kernels` on torch tensors) marks each of its kernels with
:func:`implements`, which checks the function's parameters against the table when the module is
imported, and hands its namespace to :func:`implementation`, which checks that it implements
every declared kernel (or, for a partial one, no undeclared one). :class:`hvdcompress.backend.Ops`
checks the user's arguments and calls these functions.

Arguments follow two rules: an ``out`` / ``*_out`` argument is an output buffer that may be the
input it replaces (in place) or None (a new array or tensor); scalars (thresholds, ``inv``,
``scale``, ``mu``) are Python numbers, or device tensors for an implementation with
``DEVICE_SCALARS``.

A kernel's C functions are those the C++ library exports for it (capi.cpp, the list
``HVDC_KERNELS`` in kernels.h); native.py checks at load time that the library exports exactly
the C functions of this table.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable, Dict, Mapping, NamedTuple, Tuple


class Kernel(NamedTuple):
    name: str
    params: str  # the Python parameters, as written in a ``def``
    c: Tuple[str, ...] = ()  # its C functions in the kernel library (default: its own name)


KERNELS: Dict[str, Kernel] = {k.name: k for k in (
    # encoders
    Kernel("sign_pack", "x"),
    Kernel("ef_sign_pack", "x, residual, out=None"),
    Kernel("twobit_pack", "x, threshold, residual=None, out=None"),
    Kernel("levels_pack", "x, inv, levels, natural, key"),
    Kernel("ternary_pack", "x, inv, key"),
    Kernel("natural_pack", "x, key"),
    Kernel("half_cast", "x, bf16"),
    Kernel("minmax_pack", "x, chunk"),
    # decoders
    Kernel("unpack_sum", "packed, n, bits, tables, out=None"),
    Kernel("bf16_sum", "bits, n, out=None"),
    Kernel("sign_vote", "packed, n, scale, out=None"),
    Kernel("minmax_unpack_sum", "codes, bounds, n, chunk, out=None"),
    Kernel("sparse_sum", "n, indices, values, out=None", c=("scatter_add_i32", "scatter_add_i64")),
    # reductions and selection
    Kernel("max_abs", "x"),
    Kernel("l2_norm", "x"),
    Kernel("count_ge", "x, threshold"),
    Kernel("select_ge", "x, threshold"),
    Kernel("sampled_threshold", "x, start, stride, top"),
    Kernel("topk_abs", "x, k"),
    # state updates
    Kernel("fill_at", "x, indices, value, out=None, non_finite_only=False"),
    Kernel("sub_finite", "a, b, out=None"),
    Kernel("momentum_correction", "g, u, v, mu, nesterov, u_out=None, v_out=None"),
    Kernel("lowrank_project", "e, g, q, out=None"),
    Kernel("lowrank_project_back", "m, p"),
    Kernel("lowrank_residual", "m, p, q, out=None"),
)}

#: The C functions of every kernel, as the library must export them.
C_FUNCTIONS: Tuple[str, ...] = tuple(c for k in KERNELS.values() for c in k.c or (k.name,))


def signature(name: str) -> inspect.Signature:
    """The declared parameters of kernel ``name``."""
    parameters = []
    for param in KERNELS[name].params.split(","):
        pname, _, default = param.strip().partition("=")
        parameters.append(inspect.Parameter(
            pname, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=ast.literal_eval(default) if default else inspect.Parameter.empty))
    return inspect.Signature(parameters)


def _parameters(fn: Callable) -> inspect.Signature:
    """``fn``'s parameters without annotations (implementations type them differently)."""
    return inspect.Signature([p.replace(annotation=inspect.Parameter.empty)
                              for p in inspect.signature(fn).parameters.values()])


def implements(fn: Callable) -> Callable:
    """Marks ``fn`` as the implementation of the kernel of its name, after checking that the
    kernel is declared and that ``fn`` takes its parameters (names, order, defaults)."""
    name = fn.__name__
    if name not in KERNELS:
        raise TypeError(f"{fn.__module__}.{name} implements no kernel of hvdcompress/ops/table.py")
    if _parameters(fn) != signature(name):
        raise TypeError(f"{fn.__module__}.{name}{_parameters(fn)} does not take the declared "
                        f"parameters {signature(name)}")
    fn.kernel = name
    return fn


def implementation(namespace: Mapping[str, Any], complete: bool = True) -> Dict[str, Callable]:
    """The kernels that the functions of ``namespace`` (a module's ``globals()``) implement, by
    name. TypeError when one of its names is a kernel's but not marked with :func:`implements`,
    or (``complete``) when a declared kernel is missing."""
    found = {name: fn for name, fn in namespace.items() if getattr(fn, "kernel", None) == name}
    where = namespace.get("__name__", "the implementation")
    unmarked = sorted(set(namespace) & set(KERNELS) - set(found))
    if unmarked:
        raise TypeError(f"{where} defines {', '.join(unmarked)} without @implements")
    missing = sorted(set(KERNELS) - set(found))
    if complete and missing:
        raise TypeError(f"{where} does not implement {', '.join(missing)}")
    return found
