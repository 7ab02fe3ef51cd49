"""The kernel table (hvdcompress/ops/table.py) and its implementations agree: every declared kernel
is implemented by the C++ library (its C functions), the numpy binding, the plain-torch fallback
and the Triton module (its own kernels or the fallback's), each with the declared parameters;
the numpy functions and Ops methods of the declared kernels are generated from their roles; and
the checks that say so fail on a missing, an undeclared or a mis-declared kernel."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest

from hvdcompress.ops import library, native, roles, table, torch_fallback
from hvdcompress.ops.facade import WRITTEN, Ops
from hvdcompress.ops.table import implementation, implements


def declared(fn: Callable) -> bool:
    """Whether ``fn`` takes the parameters its kernel is declared with (names, order, defaults)."""
    got = [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
    want = [(p.name, p.default) for p in table.signature(fn.__name__).parameters.values()]
    return got == want


@pytest.mark.parametrize("module", [native, torch_fallback], ids=lambda m: m.__name__)
def test_every_kernel_is_implemented_with_the_declared_parameters(module):
    kernels = implementation(vars(module))
    assert sorted(kernels) == sorted(table.KERNELS)
    assert all(getattr(module, name) is fn and declared(fn) for name, fn in kernels.items())


def test_the_declared_parameters_are_those_of_the_def_syntax():
    assert str(table.signature("fill_at")) == "(x, indices, value, out=None, non_finite_only=False)"
    assert str(table.signature("sign_pack")) == "(x)"


def test_the_library_exports_exactly_the_declared_c_functions():
    functions = native.load()
    assert sorted(functions) == sorted(table.C_FUNCTIONS)
    assert table.C_FUNCTIONS.count("scatter_add_i32") == 1 and "sparse_sum" not in table.C_FUNCTIONS


def test_the_bridge_has_every_kernel_with_its_parameters():
    bridge = native.Bridge(lambda a: False, lambda a: a, lambda a: a)
    assert all(declared(getattr(bridge, name)) for name in table.KERNELS)


TRITON_CHECK = """
import inspect, json
from hvdcompress.ops import table, torch_fallback, triton_kernels
own = table.implementation(vars(triton_kernels), complete=False)
print(json.dumps({"own": sorted(own), "resolved": {
    name: [getattr(triton_kernels, name).__module__,
           [(p.name, repr(p.default)) for p in inspect.signature(getattr(triton_kernels, name)).parameters.values()]]
    for name in table.KERNELS}}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_triton_module_implements_every_kernel_itself_or_through_the_fallback():
    """In a fresh interpreter: importing triton here without TRITON_INTERPRET=1 would compile
    tests/test_triton_kernels.py's kernels for a GPU."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["own"] and set(found["own"]) < set(table.KERNELS)
    for name, (module, params) in found["resolved"].items():
        assert module.endswith("triton_kernels" if name in found["own"] else "torch_fallback"), name
        assert params == [[p.name, repr(p.default)] for p in table.signature(name).parameters.values()]


# ---- the checks fail --------------------------------------------------------------------------
def test_an_undeclared_kernel_is_refused():
    def sign_unpack(x):
        return x

    with pytest.raises(TypeError, match="sign_unpack implements no kernel"):
        implements(sign_unpack)


@pytest.mark.parametrize("fn", [lambda x, resid, out=None: x, lambda x, residual, out: x,
                                lambda x, residual: x, lambda x, residual, out=None, extra=None: x],
                         ids=["renamed", "no default", "missing", "extra"])
def test_other_parameters_are_refused(fn):
    fn.__name__ = "ef_sign_pack"
    with pytest.raises(TypeError, match="does not take the declared parameters"):
        implements(fn)


def test_a_missing_kernel_fails_a_complete_implementation_only():
    namespace = {name: fn for name, fn in vars(torch_fallback).items() if name != "topk_abs"}
    with pytest.raises(TypeError, match="does not implement topk_abs"):
        implementation(namespace)
    assert "topk_abs" not in implementation(namespace, complete=False)


def test_a_kernel_defined_without_implements_fails():
    namespace = dict(vars(torch_fallback), max_abs=lambda x: x)
    with pytest.raises(TypeError, match="defines max_abs without @implements"):
        implementation(namespace, complete=False)


def test_a_library_with_other_c_functions_does_not_load():
    exported = set(table.C_FUNCTIONS) - {"topk_abs"} | {"topk_abs_v2"}
    with pytest.raises(ImportError, match=r"missing: \['topk_abs'\], not declared: \['topk_abs_v2'\]"):
        library.check_exports(exported, "lib.so")


def test_a_library_whose_c_function_takes_another_call_does_not_load():
    native.load()
    signatures = dict(library._LIB["signatures"])
    library.check_calls(signatures, "lib.so")
    with pytest.raises(ImportError, match="natural_pack takes 'PqP'"):
        library.check_calls(dict(signatures, natural_pack=("PqP", "", "")), "lib.so")
    with pytest.raises(ImportError, match="count_ge takes 'Pqf' and returns f"):
        library.check_calls(dict(signatures, count_ge=("Pqf", ">", "f")), "lib.so")


# ---- generated from the declarations ------------------------------------------------------------
def test_native_generates_the_kernels_declared_with_a_c_call_and_the_rest_is_written():
    generated = native.generate(table.KERNELS["natural_pack"]).__code__
    written = {name for name in table.KERNELS if getattr(native, name).__code__ is not generated}
    assert written == {name for name, k in table.KERNELS.items() if k.c is None} == {
        "select_ge", "dgc_select", "sparse_sum", "fill_at", "lowrank_project", "lowrank_project_back",
        "lowrank_residual"}


def test_a_kernel_written_by_hand_and_declared_with_a_c_call_is_refused():
    with pytest.raises(TypeError, match="writes natural_pack by hand"):
        native._generated({"natural_pack": native.natural_pack})


def test_ops_has_a_generated_method_for_every_kernel_not_written_by_hand():
    for name, kernel in table.KERNELS.items():
        if name in WRITTEN:
            continue
        user = [p for p in kernel.params if not isinstance(p.role, roles.Into)]
        got = list(inspect.signature(getattr(Ops, name)).parameters.values())[1:]
        assert [(p.name, p.default) for p in got] == [(p.name, p.default) for p in user], name
        assert kernel.declaration in getattr(Ops, name).__doc__


def test_the_generated_numpy_functions_check_their_arguments():
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="x must be a float32 tensor, got float64"):
        native.natural_pack(np.zeros(4), 1)
    with pytest.raises(ValueError, match="x must be a contiguous 1-D tensor, got a non-contiguous"):
        native.natural_pack(np.zeros(8, np.float32)[::2], 1)
    with pytest.raises(ValueError, match="residual has 3 elements, x has 4"):
        native.ef_sign_pack(x, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="out is read-only"):
        native.ef_sign_pack(x, x, out=_read_only(4))
    with pytest.raises(ValueError, match="natural_pack: key=-1 is out of range"):
        native.natural_pack(x, -1)
    with pytest.raises(ValueError, match=r"bounds has 2 entries; 2 \* ranks \* cdiv\(n, chunk\) = 4"):
        native.minmax_unpack_sum(np.zeros(4, np.uint8), np.zeros(2, np.float32), 4, 2)


def _read_only(n: int) -> np.ndarray:
    a = np.zeros(n, np.float32)
    a.setflags(write=False)
    return a


def test_roles_that_need_sizes_no_parameter_defines_are_refused():
    with pytest.raises(TypeError, match=r"the roles of \['packed'\] need sizes"):
        table.Kernel("bad", "packed: Payloads('uint8', 'm')")


def test_a_c_call_with_an_unknown_argument_is_refused():
    with pytest.raises(TypeError, match=r"unknown: \['m'\]"):
        table.Kernel("bad", "x: Vector()", c="x, m")
