"""The kernel table: every kernel declared once, with what it takes, checks and returns.

``kernels.h`` specifies what each kernel computes; this table says how Python calls it. A kernel
is declared by

* its parameters, written as in a ``def``, each annotated with its *role*: what the
  argument must be, hence the user-facing checks, and the sizes it defines (``n``, ``ranks``;
  :mod:`~hvdcompress.ops.roles`);
* for the C++ library, ``c``: its C function's arguments in order (parameters, sizes, new
  outputs; ``&name``: the address the function's returned value is written to), and
  ``returns``: its results, each a parameter (an output buffer) or a new output, written as
  ``name: dtype[size]`` (a new array), ``name: float32`` (0-d), ``name: int`` or ``name: float``
  (a Python number); sizes are Python expressions of the parameters, ``n``, ``ranks``,
  :func:`packed_bytes` and :func:`cdiv`.

From this, :mod:`~hvdcompress.ops.native` generates the numpy function of every kernel with a
``c`` (checks, output allocation, the C call) and :class:`hvdcompress.ops.facade.Ops` the checked
user-facing method of every kernel with roles; kernels that need more are written by hand there
(each module lists its own). An implementation on torch tensors
(:mod:`~hvdcompress.ops.torch_fallback`, :mod:`~hvdcompress.ops.triton_kernels`) marks each of
its kernels with :func:`implements`, which checks the function's parameters against the table
when the module is imported, and hands its namespace to :func:`implementation`, which checks
that it implements every declared kernel (or, for a partial one, no undeclared one).

Arguments follow two rules: an ``out`` / ``*_out`` argument is an output buffer that may be the
input it replaces (in place) or None (a new array or tensor); scalars (thresholds, ``inv``,
``scale``, ``mu``) are Python numbers, or device tensors for an implementation with
``DEVICE_SCALARS``.

A kernel's C functions are those the C++ library exports for it (capi.cpp, the list
``HVDC_KERNELS`` in kernels.h); native.py checks at load time that the library exports exactly
the C functions of this table, with the argument kinds of each ``c``.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from .roles import ROLES, Role, Size


# ---- kernels --------------------------------------------------------------------------------
class Param(NamedTuple):
    name: str
    role: Optional[Role]  # None: not declared (the kernel's numpy and Ops code are written by hand)
    default: Any


#: The numpy dtype in which the C function writes a Python number result.
NUMBERS = {"int": ("int64", int), "float": ("float32", float)}


class Result(NamedTuple):
    name: str
    kind: Optional[str]  # None: a parameter; "int", "float" (a Python number) or a numpy dtype
    size: Optional[Size]  # a new array's length; None: a Python number or a 0-d array

    @property
    def dtype(self) -> str:
        """The numpy dtype the C function writes."""
        return NUMBERS[self.kind][0] if self.kind in NUMBERS else self.kind

    def value(self, written: Any) -> Any:
        """The result as returned: ``written`` itself, or the Python number it holds."""
        return NUMBERS[self.kind][1](written) if self.kind in NUMBERS else written


class Kernel:
    """A kernel's declaration (see the module doc). ``exports``: its C functions, when they are
    not the one of its name (``sparse_sum`` calls ``scatter_add_i32`` or ``scatter_add_i64``)."""

    def __init__(self, name: str, params: str, c: Optional[str] = None, returns: str = "",
                 doc: str = "", exports: Tuple[str, ...] = ()):
        self.name, self.doc, self.exports = name, doc, exports or (name,)
        self.declaration = params
        self.params = tuple(Param(a.arg, _role(a.annotation), d) for a, d in _arguments(params))
        self.results = tuple(Result(a.arg, *_result(a.annotation)) for a, _ in _arguments(returns))
        self.c = None if c is None else tuple(a.strip() for a in c.split(","))
        self.order = _check_order(self)
        if self.c is not None:
            _check_c_call(self)

    @property
    def has_roles(self) -> bool:
        return all(p.role is not None for p in self.params)

    def signature(self) -> inspect.Signature:
        """The declared parameters (names, order, defaults)."""
        return inspect.Signature([inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    default=p.default) for p in self.params])

    def bind(self, args: tuple, kwargs: dict, params: Optional[Tuple[Param, ...]] = None) -> dict:
        """The arguments of a call by parameter name, defaults filled in, as
        ``inspect.Signature.bind`` makes them (the same TypeErrors), faster: a kernel call is
        often a few microseconds. ``params``: these parameters instead of all."""
        params = self.params if params is None else params
        if len(args) > len(params):
            raise TypeError(f"{self.name}() takes {len(params)} arguments, {len(args)} given")
        env = {p.name: a for p, a in zip(params, args)}
        for name, value in kwargs.items():
            if name in env or all(p.name != name for p in params):
                raise TypeError(f"{self.name}() got {'multiple values for' if name in env else 'an unexpected'} "
                                f"argument {name!r}")
            env[name] = value
        for p in params[len(args):]:
            if p.name not in env:
                if p.default is inspect.Parameter.empty:
                    raise TypeError(f"{self.name}() missing the argument {p.name!r}")
                env[p.name] = p.default
        return env

    def result(self, name: str) -> Result:
        return next(r for r in self.results if r.name == name)

    def is_pointer(self, arg: str) -> bool:
        """Whether the C argument ``arg`` (an entry of :attr:`c`) is an address."""
        params = {p.name: p.role for p in self.params}
        return arg.startswith("&") or arg in {r.name for r in self.results} or getattr(params.get(arg), "tensor", False)


def _arguments(params: str) -> list:
    """The ``ast.arg`` nodes of the parameter list ``params`` with their literal defaults."""
    args = ast.parse(f"def _({params}): pass").body[0].args
    defaults = [inspect.Parameter.empty] * (len(args.args) - len(args.defaults))
    return list(zip(args.args, defaults + [ast.literal_eval(d) for d in args.defaults]))


def _role(annotation: Optional[ast.expr]) -> Optional[Role]:
    """The role a parameter's annotation names (None without one)."""
    return None if annotation is None else eval(ast.unparse(annotation), dict(ROLES))


def _result(annotation: Optional[ast.expr]) -> tuple:
    """A result's kind and size from its annotation (``uint8[n]``, ``float32``, ``int``)."""
    if annotation is None:
        return None, None
    if isinstance(annotation, ast.Subscript):
        return annotation.value.id, Size(ast.unparse(annotation.slice))
    return annotation.id, None


def _check_order(kernel: Kernel) -> Tuple[Param, ...]:
    """The declared parameters in an order where each comes after those it needs (the declared
    order otherwise); TypeError when there is none."""
    if not kernel.has_roles:
        return kernel.params
    known, order, left = set(), [], list(kernel.params)
    while left:
        ready = next((p for p in left if p.role.needs() <= known), None)
        if ready is None:
            raise TypeError(f"{kernel.name}: the roles of {[p.name for p in left]} need sizes "
                            "that no parameter defines")
        left.remove(ready)
        order.append(ready)
        known |= {ready.name, *ready.role.defines}
    return tuple(order)


def _check_c_call(kernel: Kernel) -> None:
    """TypeError unless every argument of the C call is a parameter, a size or a result."""
    names = {p.name for p in kernel.params} | {r.name for r in kernel.results} | {
        d for p in kernel.params for d in (p.role.defines if p.role else ())}
    unknown = [a for a in kernel.c if a.lstrip("&") not in names]
    returned = [a for a in kernel.c[:-1] if a.startswith("&")]
    if unknown or returned or not kernel.has_roles:
        raise TypeError(f"{kernel.name}: the C call needs declared roles, known arguments "
                        f"(unknown: {unknown}) and &result only last (not {returned})")


KERNELS: Dict[str, Kernel] = {k.name: k for k in (
    # encoders
    Kernel("sign_pack", "x: Vector()", c="x, n, packed, &mean",
           returns="packed: uint8[packed_bytes(n, 1)], mean: float32[1]",
           doc="``(packed, [mean |x|])``"),
    Kernel("sign_pack_runs", "x: Vector(), run: LENGTH", c="x, n, run, packed, means",
           returns="packed: uint8[packed_bytes(n, 1)], means: float32[cdiv(n, run)]",
           doc="``(packed, means)``: :meth:`sign_pack`'s codes and the mean |x| of each run of "
               "``run`` elements (the last one shorter), summed in double"),
    Kernel("ef_sign_pack", "x: Vector(), residual: Vector(like='x'), out: Into('residual') = None",
           c="x, residual, n, packed, out, &scale",
           returns="packed: uint8[packed_bytes(n, 1)], scale: float32[1], out",
           doc="``(packed, [scale], residual)``"),
    Kernel("twobit_pack", "x: Vector(), threshold: Scalar(), residual: Vector(like='x') = None, "
                          "out: Into('residual') = None",
           c="x, residual, n, threshold, packed, out",
           returns="packed: uint8[packed_bytes(n, 2)], out",
           doc="``(packed, residual or None)``; decode with :meth:`unpack_sum` and the table "
               "``[0, nan, -t, +t]``"),
    Kernel("levels_pack", "x: Vector(), inv: Scalar(), levels: Count(1, 127), natural: FLAG, key: KEY",
           c="x, n, inv, levels, natural, key, codes", returns="codes: uint8[n]",
           doc="Stochastic rounding of ``|x| * inv`` to ``levels`` levels, one int8 code per "
               "element. Unbiased when r <= levels (linear) or r <= 1 (natural)"),
    Kernel("ternary_pack", "x: Vector(), inv: Scalar(), key: KEY",
           c="x, n, inv, key, codes", returns="codes: uint8[packed_bytes(n, 2)]",
           doc=":meth:`levels_pack` with one linear level, as 2-bit codes"),
    Kernel("natural_pack", "x: Vector(), key: KEY", c="x, n, key, codes", returns="codes: uint8[n]",
           doc="Natural compression, one byte per element (unbiased)"),
    Kernel("half_cast", "x: Vector(), bf16: FLAG", c="x, n, bf16, bits", returns="bits: int16[n]",
           doc="The bit patterns of ``x`` rounded to binary16 (bfloat16 when ``bf16``), as int16"),
    Kernel("minmax_pack", "x: Vector(), chunk: LENGTH, bits: Choice(4, 8) = 8", c="x, n, chunk, bits, codes, bounds",
           returns="codes: uint8[packed_bytes(n, bits)], bounds: float32[2 * cdiv(n, chunk)]",
           doc="Bagua's min-max quantisation per chunk, 8 or 4 bits: ``(codes, bounds)`` (4 bits: "
               "two codes per byte, the first in the high nibble; ``chunk`` even)"),
    # decoders: the float32 sum of R payloads
    Kernel("unpack_sum", "packed: Payloads('uint8', 'packed_bytes(n, bits)'), n: LENGTH, "
                         "bits: Choice(1, 2, 8), tables: Sized('float32', 'ranks << bits'), "
                         "out: Out() = None",
           c="packed, n, bits, tables, ranks, out", returns="out",
           doc="Decode R payloads of ``bits``-bit codes through per-rank float32 tables and sum them"),
    Kernel("bf16_sum", "bits: Payloads('int16', 'n'), n: LENGTH, out: Out() = None",
           c="bits, n, ranks, out", returns="out",
           doc="Decode and sum R payloads of ``n`` bfloat16 values given as int16 bit patterns"),
    Kernel("fp16_sum", "bits: Payloads('int16', 'n'), n: LENGTH, out: Out() = None",
           c="bits, n, ranks, out", returns="out",
           doc="Decode and sum R payloads of ``n`` IEEE binary16 values given as int16 bit "
               "patterns (the first payload's values, then the others added: R = 1 is the exact "
               "float32 of each half, -0.0 included; NaNs quieted, as F16C)"),
    Kernel("sign_vote", "packed: Payloads('uint8', 'packed_bytes(n, 1)'), n: LENGTH, "
                        "scale: NUMBER, out: Out() = None",
           c="packed, n, ranks, scale, out", returns="out",
           doc="Majority vote of R :meth:`sign_pack` payloads times ``scale``"),
    Kernel("sign_runs_sum", "packed: Payloads('uint8', 'packed_bytes(n, 1)'), "
                            "means: Sized('float32', 'ranks * cdiv(n, run)'), n: LENGTH, run: LENGTH, "
                            "out: Out() = None",
           c="packed, means, n, run, ranks, out", returns="out",
           doc="Sum of R :meth:`sign_pack_runs` payloads: ``(bit ? 1 : -1) * means_r[i // run]`` "
               "added in rank order from +0.0"),
    Kernel("minmax_unpack_sum", "codes: Payloads('uint8', 'packed_bytes(n, bits)'), "
                                "bounds: Sized('float32', '2 * ranks * cdiv(n, chunk)'), "
                                "n: LENGTH, chunk: LENGTH, bits: Choice(4, 8) = 8, out: Out() = None",
           c="codes, bounds, n, chunk, bits, ranks, out", returns="out",
           doc="Sum of R :meth:`minmax_pack` payloads, decoded"),
    Kernel("sparse_sum", "n, indices, values, out=None", exports=("scatter_add_i32", "scatter_add_i64")),
    # reductions and selection
    Kernel("max_abs", "x: Vector()", c="x, n, &max", returns="max: float32"),
    Kernel("l2_norm", "x: Vector()", c="x, n, &norm", returns="norm: float32"),
    Kernel("count_ge", "x: Vector(), threshold: Scalar()", c="x, n, threshold, &count",
           returns="count: int",
           doc="How many elements are selected: |x[i]| >= threshold, or x[i] is NaN. A Python "
               "int from the C++ kernels; a 0-d int64 tensor on x's device from the device "
               "implementations (no host read)"),
    Kernel("select_ge", "x: Vector(), threshold: Scalar()",
           doc="``(values, indices)`` of the elements :meth:`count_ge` selects, indices "
               "ascending int64. The outputs' size depends on the data: the one host read a "
               "device path needs"),
    Kernel("sampled_threshold", "x: Vector(), start: INT, stride: INT, top: INT",
           c="x, n, start, stride, top, &threshold", returns="threshold: float",
           doc="The ``top``-th largest magnitude among ``x[start::stride]``: a Python float from "
               "the C++ kernels, a 0-d float32 tensor on x's device from the device "
               "implementations (no host read)"),
    Kernel("topk_abs", "x: Vector(), k: Count(0, 'n')", c="x, n, k, values, indices",
           returns="values: float32[k], indices: int64[k]",
           doc="Exact top-k by magnitude: ``(values, indices)``, indices ascending int64"),
    # state updates
    Kernel("fill_at", "x, indices, value, out=None, non_finite_only=False"),
    Kernel("sub_finite", "a: Vector(), b: Vector(like='a'), out: Out() = None",
           c="a, b, n, out", returns="out"),
    Kernel("momentum_correction", "g: Vector(), u: Vector(like='g'), v: Vector(like='g'), "
                                  "mu: NUMBER, nesterov: FLAG, u_out: Into('u') = None, "
                                  "v_out: Into('v') = None",
           c="g, u, v, n, mu, nesterov, u_out, v_out", returns="u_out, v_out"),
    Kernel("dgc_select", "g: Vector(), u: Vector(like='g'), v: Vector(like='g'), mu: NUMBER, "
                         "nesterov: FLAG, start: INT, stride: INT, top: INT, cap: Count(0, 'n'), "
                         "low: INT, high: INT, masking: FLAG, u_out: Into('u') = None, "
                         "v_out: Into('v') = None",
           doc=":meth:`momentum_correction` fused with DGC's selection and release: ``(u, v, "
               "values, indices, count, threshold)``. The threshold is the ``top``-th largest "
               "magnitude of the new v at ``start::stride`` (+inf for a NaN); ``count`` elements "
               "are selected (``|v| >= threshold`` or NaN), and when ``low <= count <= high`` the "
               "first ``min(count, cap)`` are returned and cleared from v (and from u with "
               "``masking``, or where u is not finite); else ``values`` and ``indices`` are empty "
               "and u, v are those of :meth:`momentum_correction`. ``count`` is a Python int, "
               "``threshold`` a Python float (one host read on a device)"),
    Kernel("lowrank_project", "e, g, q, out=None"),
    Kernel("lowrank_project_back", "m, p"),
    Kernel("lowrank_residual", "m, p, q, out=None"),
)}

#: The C functions of every kernel, as the library must export them.
C_FUNCTIONS: Tuple[str, ...] = tuple(c for k in KERNELS.values() for c in k.exports)


def signature(name: str) -> inspect.Signature:
    """The declared parameters of kernel ``name``."""
    return KERNELS[name].signature()


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
