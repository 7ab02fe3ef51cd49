"""The kernel table (hvdcompress/ops/table.py) and its implementations agree: every declared kernel
is implemented by the C++ library (its C functions), the numpy binding, the plain-torch fallback
and the Triton module (its own kernels or the fallback's), each with the declared parameters;
and the checks that say so fail on a missing, an undeclared or a mis-declared kernel."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from typing import Callable

import pytest

from hvdcompress.ops import native, table, torch_fallback
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
        native._check_exports(exported, "lib.so")
