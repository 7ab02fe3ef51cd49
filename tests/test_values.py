"""Bad values of every public constructor's parameters: a ValueError (or TypeError) naming the
parameter and the value; good values, numpy scalars included, accepted.

The table is built from the signatures: every registered compressor, Int4, the decorators, the
schedules and the scheduler; each parameter gets the bad values of its type hint's kind. A new
constructor is covered by registering it (or listing it in CONSTRUCTORS); a parameter of a kind
without a row fails :func:`test_every_parameter_has_a_kind` until one is added.
"""
from __future__ import annotations

import inspect
import math
import re
import typing
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import hvdcompress as hc
from hvdcompress.auto.choice import CHOICES, PICKABLE, parse_allowed
from hvdcompress.contract.compressor import Compressor
from hvdcompress.contract.schedule import Schedule
from hvdcompress.registry import _REGISTRY, as_compressor, from_params
from hvdcompress.step.names import check_names
from hvdcompress.step.options import check_unwrapped, parse_options

#: the package's own registered algorithms (a test module may register one of its own, e.g.
#: tests/external_compressor.py, in the same process: the table must not depend on that)
OWN = [name for name in hc.available() if _REGISTRY[name].__module__.startswith("hvdcompress.")]

AVERAGE, SUM = object(), object()   # the front ends' hvd.Average / hvd.Sum
NAN = float("nan")

#: Every public constructor with the arguments it needs (the others take their defaults).
CONSTRUCTORS: Dict[str, Tuple[Callable, dict]] = {
    **{name: (cls, {}) for name, cls in _REGISTRY.items() if name in OWN},
    "int4": (hc.Int4, {}),
    "ErrorFeedback": (hc.ErrorFeedback, {"inner": hc.TopK()}),
    "Momentum": (hc.Momentum, {"inner": hc.TopK()}),
    "FrozenAdam": (hc.FrozenAdam, {"inner": hc.OneBit()}),
    "ExponentialWarmup": (hc.ExponentialWarmup, {"length": 3}),
    "ListWarmup": (hc.ListWarmup, {"sparsities": [0.5, 0.9]}),
    "SparsityScheduler": (hc.SparsityScheduler, {"compressor": hc.DGC(0.99)}),
}
#: Good values where the default is None or the kind has no default to mirror.
GOOD = {"momentum": 0.5, "clip_norm": 1.0, "weight_decay": 1e-4, "mu": 0.9, "freeze_steps": 4,
        "live_steps": 4, "min_numel": 16, "length": 2}


def _kind(hint: Any) -> str:
    """The kind of a parameter's type hint: what its bad and good values are made of."""
    args = set(typing.get_args(hint)) - {type(None)}
    if str(hint).startswith("typing.Sequence["):
        return "numbers"
    if hint is bool or args == {bool}:
        return "bool"
    if hint is int or args == {int}:
        return "int"
    if hint is float or args == {float}:
        return "float"
    if args == {int, float}:
        return "count or fraction"
    if args == {int, str}:
        return "int or name"
    if hint is str:
        return "name"
    if hint is Compressor:
        return "compressor"
    if hint is Schedule or args == {Schedule}:
        return "schedule"
    if hint is Any:
        return "object"
    raise AssertionError(f"no kind for {hint!r}: add one to _kind with its bad values")


#: kind -> the bad values of that kind (a string for a number, a bool for an int, a negative, NaN).
BAD = {
    "bool": ["false", "true", 0, 1, None],
    "int": ["8", True, -1, NAN, 2.5],
    "float": ["0.5", True, -1.0, NAN],
    "count or fraction": ["0.01", True, -1, NAN],
    "int or name": ["8", True, -1, NAN, "gibberish"],
    "name": ["gibberish", 3],
    "compressor": ["topk", 3],
    "schedule": ["epoch", 5],
    "object": ["dgc"],
    "numbers": [["0.5"], [True], [-0.5], [NAN]],
}


def _signature(cls: type) -> Dict[str, inspect.Parameter]:
    """The parameters a constructor names (none for a class without an ``__init__`` of its own)."""
    return {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _parameters() -> List[Tuple[str, str, inspect.Parameter, str]]:
    rows = []
    for label, (cls, _) in CONSTRUCTORS.items():
        hints = typing.get_type_hints(cls.__init__)
        rows += [(label, key, param, _kind(hints.get(key, Any))) for key, param in _signature(cls).items()]
    return rows


PARAMETERS = _parameters()
BAD_ROWS = [pytest.param(label, key, value, id=f"{label}.{key}={value!r}")
            for label, key, _, kind in PARAMETERS for value in BAD[kind]
            if not (value is None and key == "nesterov")]   # nesterov=None: the optimizer's


def _good(key: str, param: inspect.Parameter, kind: str) -> list:
    """Good values of a parameter: its default as numpy scalars (or a valid number)."""
    base = param.default if param.default not in (inspect.Parameter.empty, None) else GOOD.get(key)
    if kind == "bool":
        return [True, False, np.bool_(base)]
    if kind == "int" or (kind in ("count or fraction", "int or name") and isinstance(base, int)):
        return [np.int64(base), np.int32(base), int(base)]
    if kind == "int or name":
        return [np.int64(64), base]
    if kind == "numbers":
        return [[np.float32(0.5), np.float64(0.9)], (np.float64(0.5),)]
    if kind in ("float", "count or fraction"):
        return [np.float64(base), np.float32(base)] + ([np.int64(1)] if kind == "count or fraction" else [])
    return []


GOOD_ROWS = [pytest.param(label, key, value, id=f"{label}.{key}={value!r}")
             for label, key, param, kind in PARAMETERS for value in _good(key, param, kind)]


def _build(label: str, **kwargs: Any) -> Any:
    cls, needed = CONSTRUCTORS[label]
    return cls(**{**needed, **kwargs})


def test_every_parameter_has_a_kind():
    """The table covers every constructor and every parameter (``_kind`` raises otherwise)."""
    assert {"onebit", "topk", "dgc", "int4", "FrozenAdam", "ListWarmup"} <= set(CONSTRUCTORS)
    assert len(PARAMETERS) > 50 and BAD_ROWS and GOOD_ROWS


@pytest.mark.parametrize("label,key,value", BAD_ROWS)
def test_a_bad_value_is_an_error_naming_the_parameter_and_the_value(label, key, value):
    with pytest.raises((ValueError, TypeError)) as error:
        _build(label, **{key: value})
    message = str(error.value)
    shown = value[0] if isinstance(value, list) else value   # a list's entry is named
    assert key in message, message
    assert repr(shown) in message, message


@pytest.mark.parametrize("label,key,value", GOOD_ROWS)
def test_good_values_numpy_scalars_included_are_accepted(label, key, value):
    """Stored as Python numbers (what reprs, checkpoints and the rank agreement compare)."""
    built = _build(label, **{key: value})
    stored = getattr(built, {"residual": "residual_inside"}.get(key, key))
    pairs = zip(stored, value) if isinstance(value, (list, tuple)) else [(stored, value)]
    for got, given in pairs:
        if isinstance(given, str):
            assert got == given
        else:
            assert type(got) in (int, float, bool) and got == pytest.approx(given), (got, given)


@pytest.mark.parametrize("label", list(CONSTRUCTORS))
def test_an_unknown_keyword_is_an_error_naming_it(label):
    with pytest.raises(TypeError, match="nonsense|takes no arguments"):
        _build(label, nonsense=1)


# ---- from_params ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OWN)
def test_from_params_an_unknown_key_names_the_compressor_and_its_keys(name):
    keys = list(_signature(_REGISTRY[name]))
    with pytest.raises(ValueError) as error:
        from_params({"compressor": name, "nonsense": "1"})
    message = str(error.value)
    assert f"not a parameter of {name}" in message and "'nonsense'" in message
    assert all(k in message for k in keys), message


@pytest.mark.parametrize("name", OWN)
def test_from_params_seed_is_a_parameter_or_an_error(name):
    """A seed given to a compressor that draws nothing is an unknown key, not dropped; BytePS's
    byteps_seed, which its trainer sets on every tensor, is checked and unused there."""
    takes = "seed" in inspect.signature(_REGISTRY[name].__init__).parameters
    if takes:
        assert from_params({"compressor": name, "seed": "7"}).seed == 7
        return
    with pytest.raises(ValueError, match=f"key 'seed' .*not a parameter of {name}; allowed keys"):
        from_params({"compressor": name, "seed": "7"})
    assert type(from_params({"compressor": name, "byteps_seed": "7"})) is _REGISTRY[name]
    with pytest.raises(ValueError, match="byteps_seed"):
        from_params({"compressor": name, "byteps_seed": "-1"})


BOOL_PARAMS = [(name, key) for name in OWN
               for key, hint in typing.get_type_hints(_REGISTRY[name].__init__).items()
               if key != "return" and _kind(hint) == "bool"]


@pytest.mark.parametrize("name,key", BOOL_PARAMS)
@pytest.mark.parametrize("text,value", [("true", True), ("False", False), ("1", True), ("0", False),
                                        ("yes", True), ("no", False), (True, True), (False, False)])
def test_from_params_reads_the_spellings_of_a_bool(name, key, text, value):
    built = from_params({"compressor": name, key: text}).unwrap()
    attribute = {"residual": "residual_inside"}.get(key, key)
    assert getattr(built, attribute) is value


@pytest.mark.parametrize("name,key", BOOL_PARAMS)
@pytest.mark.parametrize("text", ["maybe", "2", 2])
def test_from_params_refuses_other_bools(name, key, text):
    with pytest.raises(ValueError) as error:
        from_params({"compressor": name, key: text})
    assert f"{key}={text!r}" in str(error.value)


@pytest.mark.parametrize("params", ["topk", ["compressor", "topk"], 3, None])
def test_from_params_of_a_non_mapping_says_so(params):
    with pytest.raises(TypeError, match=re.escape(f"params={params!r} is not a mapping; allowed: a dict")):
        from_params(params)


# ---- the reported cases -----------------------------------------------------------------------
def test_the_reported_values():
    with pytest.raises(ValueError, match="OneBit: scale='false' is not a bool; allowed: True or False"):
        hc.OneBit(scale="false")
    assert hc.from_params({"compressor": "onebit", "scale": "false"}).scale is False
    assert hc.Int8(chunk=np.int64(1024)).chunk == 1024 and type(hc.Int8(np.int64(8)).chunk) is int
    assert hc.TopK(np.int64(5)).k == 5 and hc.TopK(np.float32(0.5)).k == 0.5
    assert hc.DGC(np.float32(0.99), nesterov=np.bool_(True)).nesterov is True


@pytest.mark.parametrize("build", [
    lambda: hc.ErrorFeedback(hc.ErrorFeedback(hc.TopK())),
    lambda: hc.ErrorFeedback(hc.Momentum(hc.ErrorFeedback(hc.TopK()))),
    lambda: hc.Momentum(hc.Momentum(hc.TopK())),
    lambda: hc.FrozenAdam(hc.FrozenAdam(hc.OneBit())),
])
def test_nested_decorators_of_the_same_kind_are_refused(build):
    with pytest.raises(ValueError, match="is wrapped in .* already; allowed: one .* per compressor"):
        build()


def test_decorators_of_different_kinds_nest():
    assert isinstance(hc.Momentum(hc.ErrorFeedback(hc.TopK())).inner, hc.ErrorFeedback)


class _Tensor:
    shape = (2,)


def test_an_exhausted_named_parameters_says_why():
    a, b = _Tensor(), _Tensor()
    named = iter([("a", a), ("b", b)])
    assert check_names(named, [a, b]) == {a: "a", b: "b"}
    with pytest.raises(ValueError, match="named_parameters is an exhausted iterator .*"
                                         r"pass list\(model.named_parameters\(\)\)"):
        check_names(named, [a, b])
    partly = iter([("a", a), ("b", b)])
    next(partly)
    with pytest.raises(ValueError, match="not in it .* partly consumed"):
        check_names(partly, [a, b])


def test_one_tensor_under_two_names_is_refused():
    a = _Tensor()
    with pytest.raises(ValueError, match="names one tensor both 'a' and 'also_a'"):
        check_names([("a", a), ("also_a", a)], [a])


def test_auto_allows_what_it_lists_and_lists_what_it_allows():
    for label in PICKABLE:
        assert list(parse_allowed([label])) == [label]
    refused = [label for label in CHOICES if label not in PICKABLE]
    assert "dgc 0.999" in refused
    for label in refused:
        with pytest.raises(ValueError) as error:
            parse_allowed([label])
        listed = str(error.value).split("labels (")[1].split(")")[0].split(", ")
        assert listed == list(PICKABLE) and label not in listed


# ---- Horovod's compression and wrapping twice -------------------------------------------------
def _horovod_class(name: str, module: str = "horovod.torch.compression") -> type:
    return type(name, (), {"__module__": module})


@pytest.mark.parametrize("module", ["horovod.torch.compression", "horovod.tensorflow.compression"])
def test_horovods_compression_none_and_fp16_map_to_ours(module):
    assert type(as_compressor(_horovod_class("FP16Compressor", module))) is hc.FP16
    assert type(as_compressor(_horovod_class("NoneCompressor", module))) is hc.NoCompression
    assert type(as_compressor(_horovod_class("FP16Compressor", module)())) is hc.FP16
    with pytest.raises(TypeError, match="a Horovod compressor other than hvd.Compression.none "
                                        "and hvd.Compression.fp16"):
        as_compressor(_horovod_class("Compressor", module))
    with pytest.raises(TypeError, match="is not supported"):
        as_compressor(_horovod_class("FP16Compressor", "mylib.compression"))


def test_horovods_own_compression_objects():
    compression = pytest.importorskip("horovod.torch.compression")
    assert type(as_compressor(compression.Compression.fp16)) is hc.FP16
    assert type(as_compressor(compression.Compression.none)) is hc.NoCompression


def test_wrapping_twice_is_refused_by_name():
    for module in ("hvdcompress.torch.optimizer", "horovod.torch.optimizer", "horovod._keras"):
        wrapped = type("SGD", (), {"__module__": module})()
        with pytest.raises(ValueError, match=f"optimizer=SGD instance is wrapped by {module} "
                                             "already; allowed: the plain optimizer, wrapped once"):
            check_unwrapped("hvdcompress.torch.DistributedOptimizer", "optimizer", wrapped)
    check_unwrapped("hvdcompress.torch.DistributedOptimizer", "optimizer", object())
    check_unwrapped("hvdcompress.torch.DistributedOptimizer", "optimizer",
                    type("SGD", (), {"__module__": "horovodish.optim"})())


# ---- the front ends' keyword arguments --------------------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("gradient_predivide_factor", np.float32(2.0)), ("backward_passes_per_step", np.int64(2)),
    ("clip_grad_norm", np.float64(1.0)), ("check_replicas", np.int64(3)), ("groups", np.int64(2)),
    ("fusion", np.int64(1 << 20)),
])
def test_front_end_numbers_accept_numpy_scalars(key, value):
    options = parse_options(None, op=AVERAGE, average_op=AVERAGE, sum_op=SUM, **{key: value})
    got = {"gradient_predivide_factor": options.predivide}.get(key, getattr(options, key, None))
    assert got == value and type(got) in (int, float)


@pytest.mark.parametrize("key,value", [
    ("gradient_predivide_factor", "2"), ("gradient_predivide_factor", True),
    ("gradient_predivide_factor", NAN), ("gradient_predivide_factor", -1.0),
    ("backward_passes_per_step", "2"), ("backward_passes_per_step", True),
    ("backward_passes_per_step", -1), ("clip_grad_norm", "1"), ("clip_grad_norm", True),
    ("clip_grad_norm", NAN), ("check_replicas", "3"), ("check_replicas", True),
    ("check_replicas", -1), ("sparse_as_dense", "false"), ("groups", True), ("fusion", "1"),
    ("fusion", -1), ("fusion", 2.5),
])
def test_front_end_bad_numbers_name_the_argument(key, value):
    with pytest.raises(ValueError) as error:
        parse_options(None, op=AVERAGE, average_op=AVERAGE, sum_op=SUM, **{key: value})
    assert f"{key}={value!r}" in str(error.value)


def test_nan_is_never_in_range():
    assert math.isnan(NAN)
    with pytest.raises(ValueError, match="threshold=nan"):
        hc.Threshold(NAN)


def test_the_torch_front_end_takes_horovods_fp16_and_refuses_wrapping_twice():
    hvd = pytest.importorskip("horovod.torch")
    import torch

    import hvdcompress.torch as hvc
    hvd.init()
    model = torch.nn.Linear(3, 2)

    def sgd() -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvc.DistributedOptimizer(sgd(), named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    assert type(opt._compression) is hc.FP16
    horovods = hvd.DistributedOptimizer(sgd(), named_parameters=model.named_parameters())
    for wrapped, module in ((opt, "hvdcompress.torch.optimizer"), (horovods, "horovod.torch.optimizer")):
        with pytest.raises(ValueError, match=f"optimizer=SGD instance is wrapped by {module} already"):
            hvc.DistributedOptimizer(wrapped, named_parameters=model.named_parameters())
    named = model.named_parameters()
    list(named)
    with pytest.raises(ValueError, match="named_parameters is an exhausted iterator"):
        hvc.DistributedOptimizer(sgd(), named_parameters=named)


def test_the_tensorflow_front_ends_refuse_wrapping_twice():
    hvd = pytest.importorskip("horovod.tensorflow")
    import tensorflow as tf

    import hvdcompress.tensorflow as hvctf
    hvd.init()
    ours = hvctf.DistributedGradientTape(tf.GradientTape(), compression=hvd.Compression.fp16)
    for tape, module in ((ours, "hvdcompress.tensorflow"), (hvd.DistributedGradientTape(tf.GradientTape()),
                                                            "horovod.tensorflow")):
        with pytest.raises(ValueError, match=f"gradtape=GradientTape instance is wrapped by {module}"):
            hvctf.DistributedGradientTape(tape)
    import hvdcompress.tensorflow.keras as hvck
    keras = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="optimizer=SGD instance is wrapped by hvdcompress.tensorflow"):
        hvck.DistributedOptimizer(keras)
