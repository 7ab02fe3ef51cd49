"""from_params: BytePS's parameter keys as aliases, and the sparsity warm-up from strings."""
from __future__ import annotations

import numpy as np
import pytest

import hvdcompress as hc
from hvdcompress.registry import parse_params


# ---- BytePS's keys -----------------------------------------------------------------------------
@pytest.mark.parametrize("params,direct", [
    ({"compressor": "dithering", "k": "4"}, hc.Dithering(levels=4)),
    ({"compressor": "qsgd", "k": "16"}, hc.QSGD(levels=16)),
    ({"compressor": "onebit", "scaling": "false"}, hc.OneBit(scale=False)),
    ({"compressor": "onebit", "scaling": "true"}, hc.OneBit(scale=True)),
    ({"byteps_compressor_type": "topk", "k": "3"}, hc.TopK(3)),
    ({"compressor": "topk", "byteps_compressor_k": "3"}, hc.TopK(3)),
    ({"compressor": "dithering", "byteps_compressor_k": "2"}, hc.Dithering(levels=2)),
    ({"compressor": "topk", "k": "3", "byteps_error_feedback_type": "vanilla"},
     hc.ErrorFeedback(hc.TopK(3))),
    ({"compressor": "topk", "k": "3", "byteps_ef_type": "vanilla"}, hc.ErrorFeedback(hc.TopK(3))),
    ({"compressor": "topk", "k": "3", "byteps_momentum_type": "nesterov"},
     hc.Momentum(hc.TopK(3), nesterov=True)),
    ({"compressor": "topk", "k": "3", "momentum": "plain", "byteps_momentum_mu": "0.8"},
     hc.Momentum(hc.TopK(3), mu=0.8, nesterov=False)),
    ({"compressor": "randomk", "k": "5", "byteps_seed": "7"}, hc.RandomK(5, seed=7)),
    ({"compressor": "onebit", "byteps_compressor_onebit_scaling": "false"}, hc.OneBit(scale=False)),
    ({"compressor": "onebit", "byteps_seed": "3"}, hc.OneBit()),  # checked, unused (no seed)
])
def test_each_byteps_alias_builds_the_same_compressor(params, direct):
    built = hc.from_params(params)
    assert type(built) is type(direct) and repr(built) == repr(direct)


def test_a_byteps_config_works_unchanged():
    """The dict of BytePS's design doc, and its MXNet trainer's tensor attributes."""
    doc = {"byteps_compressor_type": "topk", "byteps_compressor_k": "3",
           "byteps_error_feedback_type": "vanilla"}
    assert repr(hc.from_params(doc)) == repr(hc.ErrorFeedback(hc.TopK(3)))
    trainer = {"byteps_compressor_type": "onebit", "byteps_compressor_onebit_scaling": "True",
               "byteps_ef_type": "vanilla", "byteps_momentum_type": "nesterov",
               "byteps_momentum_mu": "0.9", "byteps_seed": "2020"}
    expected = hc.Momentum(hc.ErrorFeedback(hc.OneBit(scale=True)), mu=0.9, nesterov=True)
    assert repr(hc.from_params(trainer)) == repr(expected)
    short = {"compressor": "dithering", "k": "4", "ef": "vanilla", "momentum": "nesterov",
             "seed": "9"}
    assert repr(hc.from_params(short)) == repr(
        hc.Momentum(hc.ErrorFeedback(hc.Dithering(levels=4, seed=9)), nesterov=True))


@pytest.mark.parametrize("params,first,second", [
    ({"compressor": "dithering", "k": "4", "levels": "8"}, "levels", "k"),
    ({"compressor": "qsgd", "levels": "8", "k": "4"}, "levels", "k"),
    ({"compressor": "onebit", "scale": "true", "scaling": "false"}, "scale", "scaling"),
    ({"compressor": "topk", "byteps_compressor_type": "randomk"}, "compressor",
     "byteps_compressor_type"),
    ({"compressor": "topk", "k": "3", "byteps_compressor_k": "4"}, "k", "byteps_compressor_k"),
    ({"compressor": "dithering", "levels": "3", "byteps_compressor_k": "4"}, "levels",
     "byteps_compressor_k"),
    ({"compressor": "topk", "ef": "vanilla", "byteps_error_feedback_type": "vanilla"}, "ef",
     "byteps_error_feedback_type"),
    ({"compressor": "topk", "byteps_error_feedback_type": "vanilla", "byteps_ef_type": "vanilla"},
     "byteps_error_feedback_type", "byteps_ef_type"),
    ({"compressor": "topk", "momentum": "plain", "byteps_momentum_type": "nesterov"}, "momentum",
     "byteps_momentum_type"),
    ({"compressor": "randomk", "seed": "1", "byteps_seed": "2"}, "seed", "byteps_seed"),
    ({"compressor": "onebit", "scaling": "true", "byteps_compressor_onebit_scaling": "true"},
     "scaling", "byteps_compressor_onebit_scaling"),
])
def test_two_keys_for_one_value_are_an_error_naming_both(params, first, second):
    with pytest.raises(ValueError, match=f"keys '{first}' and '{second}' both give"):
        hc.from_params(params)


@pytest.mark.parametrize("params,message", [
    ({"compressor": "topk", "scaling": "true"}, "key 'scaling' .* not a parameter of topk"),
    ({"compressor": "terngrad", "k": "4"}, "key 'k' .* not a parameter of terngrad"),
    ({"compressor": "topk", "byteps_compressor_onebit_scaling": "true"},
     "key 'byteps_compressor_onebit_scaling' .* not a parameter of topk"),
    ({"compressor": "dithering", "k": "400"},
     r"Dithering: levels=400 is out of range; allowed: an integer >= 1 and <= 127 "
     r"\(from_params read 'k' as 'levels'\)"),
    ({"compressor": "dithering", "k": "four"}, "k='four' cannot be read as int"),
    ({"byteps_compressor_type": "zip"}, "byteps_compressor_type='zip' is unknown; allowed:"),
    ({"compressor": "topk", "byteps_momentum_type": "heavy"},
     "byteps_momentum_type='heavy' is unknown; allowed: 'none', 'plain', 'nesterov'"),
    ({"compressor": "topk", "byteps_ef_type": "corrected"},
     "byteps_ef_type='corrected' is unknown; allowed: 'none', 'vanilla'"),
    ({"compressor": "topk", "momentum_mu": "0.9"},
     "momentum_mu='0.9' without momentum; allowed: with momentum 'plain' or 'nesterov'"),
])
def test_alias_errors_name_the_key_as_given(params, message):
    with pytest.raises(ValueError, match=message):
        hc.from_params(params)


# ---- warm-up from strings ----------------------------------------------------------------------
def sparsities_by_epoch(dgc: hc.DGC, epochs: int) -> list:
    sched = hc.SparsityScheduler(dgc)
    seen = []
    for _ in range(epochs):
        seen.append(sched.get_sparsity())
        sched.step()
    return seen


def sparsities_by_step(dgc: hc.DGC, steps: int) -> list:
    seen = []
    for _ in range(steps):
        seen.append(dgc.current_sparsity)
        dgc.on_step()
    return seen


def test_warmup_epochs_is_the_dgc_papers_ramp():
    dgc = hc.from_params({"compressor": "dgc", "sparsity": "0.999", "warmup_epochs": "4"})
    got = sparsities_by_epoch(dgc, 7)
    density = 0.001 ** (np.arange(1, 5) / 5)  # four epochs below the target, then the target
    np.testing.assert_allclose(got[:4], 1 - density, rtol=1e-12)
    assert got[4:] == [0.999, 0.999, 0.999]
    # the paper's 75%, 93.75%, 98.4375%, 99.6%
    np.testing.assert_allclose(got[:4], [0.75, 0.9375, 0.984375, 0.996], atol=1.5e-3)
    assert repr(dgc) == repr(hc.DGC(0.999, warmup=hc.ExponentialWarmup(5)))


def test_warmup_steps_counts_the_same_ramp_in_steps():
    dgc = hc.from_params({"compressor": "dgc", "sparsity": "0.99", "warmup_steps": "3"})
    got = sparsities_by_step(dgc, 6)
    np.testing.assert_allclose(got[:3], [1 - 0.01 ** 0.25, 0.9, 1 - 0.01 ** 0.75], rtol=1e-12)
    assert got[3:] == [0.99, 0.99, 0.99]
    assert sparsities_by_epoch(hc.from_params({"compressor": "dgc", "sparsity": "0.99",
                                               "warmup_steps": "3"}), 3)[2] == got[0]


def test_warmup_zero_is_no_warmup():
    dgc = hc.from_params({"compressor": "dgc", "sparsity": "0.9", "warmup_epochs": "0"})
    assert dgc.warmup is None and dgc.current_sparsity == 0.9


@pytest.mark.parametrize("unit", ["epoch", "step", None])
def test_warmup_sparsities_one_per_unit_then_the_target(unit):
    params = {"compressor": "dgc", "sparsity": "0.999",
              "warmup_sparsities": "0.75,0.9375,0.984375,0.996"}
    if unit:
        params["warmup_unit"] = unit
    dgc = hc.from_params(params)
    walk = sparsities_by_step if unit == "step" else sparsities_by_epoch
    assert walk(dgc, 7) == [0.75, 0.9375, 0.984375, 0.996, 0.999, 0.999, 0.999]
    other = sparsities_by_epoch if unit == "step" else sparsities_by_step
    assert set(other(hc.from_params(params), 3)) == {0.75}  # the other counter moves nothing


def test_paddle_rampup_begin_and_length():
    dgc = hc.from_params({"compressor": "dgc", "sparsity": "0.999",
                          "warmup_sparsities": "0.75,0.9375,0.984375,0.996,0.999",
                          "rampup_begin_step": "10", "rampup_step": "50"})
    got = sparsities_by_step(dgc, 61)
    # Paddle: dense before step 10, then list[(t - 10) * 5 // 50]
    assert [got[t] for t in (0, 9, 10, 19, 20, 29, 30, 49, 50, 59, 60)] == \
        [0.0, 0.0, 0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.996, 0.999, 0.999, 0.999]
    short = hc.from_params({"compressor": "dgc", "sparsity": "0.99", "warmup_sparsities": "0.5,0.9",
                            "rampup_step": "4", "warmup_unit": "step"})
    assert sparsities_by_step(short, 6) == [0.5, 0.5, 0.9, 0.9, 0.99, 0.99]


def test_warmup_from_strings_gives_the_same_repr_every_time():
    """The torch optimizer compares repr(compressor) across ranks."""
    params = {"compressor": "dgc", "sparsity": "0.999", "warmup_sparsities": "0.75, 0.9375",
              "rampup_begin_step": "2", "rampup_step": "8"}
    first, second = hc.from_params(params), hc.from_params(dict(reversed(list(params.items()))))
    assert repr(first) == repr(second)
    assert "ListWarmup([0.75, 0.9375], begin=2, length=8, unit='step', to_target=True)" in repr(first)


def test_typed_warmup_still_passes_and_strings_elsewhere_are_refused():
    schedule = hc.ExponentialWarmup(3)
    assert hc.from_params({"compressor": "dgc", "warmup": schedule}).warmup is schedule
    assert hc.from_params({"compressor": "dgc", "warmup": "none"}).warmup is None
    with pytest.raises(ValueError, match="key 'warmup_epochs' .* not a parameter of topk"):
        hc.from_params({"compressor": "topk", "warmup_epochs": "4"})
    typed = hc.from_params({"compressor": "dgc", "warmup_sparsities": (0.5, 0.9)})
    assert typed.warmup.sparsities == [0.5, 0.9] and typed.warmup.unit == "epoch"
    with pytest.raises(ValueError, match="warmup_sparsities=0.9 cannot be read as numbers"):
        hc.from_params({"compressor": "dgc", "warmup_sparsities": 0.9})


@pytest.mark.parametrize("warmup,message", [
    ({"warmup_epochs": "-1"}, "warmup_epochs=-1 is out of range; allowed: an integer >= 0"),
    ({"warmup_epochs": "four"}, "warmup_epochs='four' cannot be read as int"),
    ({"warmup_epochs": "2.5"}, r"warmup_epochs='2.5' cannot be read as int"),
    ({"warmup_steps": "-3"}, "warmup_steps=-3 is out of range; allowed: an integer >= 0"),
    ({"warmup_epochs": "4", "warmup_steps": "100"},
     "keys 'warmup_epochs' and 'warmup_steps' both give the warm-up"),
    ({"warmup_steps": "4", "warmup_sparsities": "0.9"},
     "keys 'warmup_steps' and 'warmup_sparsities' both give the warm-up"),
    ({"warmup": "4"}, "warmup='4' is a string; allowed: a Schedule, or warmup_epochs=N"),
    ({"warmup_sparsities": "0.75,x"}, "warmup_sparsities='0.75,x' cannot be read as numbers; "
                                      "allowed: comma-separated numbers"),
    ({"warmup_sparsities": ""}, "warmup_sparsities='' cannot be read as numbers"),
    ({"warmup_sparsities": "0.75,1.0"}, r"warmup_sparsities='0.75,1.0': ListWarmup: "
                                        r"sparsities=1.0 is out of range; allowed: a number in \[0.0, 1.0\)"),
    ({"warmup_sparsities": "-0.1,0.5"}, "sparsities=-0.1 is out of range"),
    ({"warmup_sparsities": "nan"}, "sparsities=nan is out of range"),
    ({"warmup_sparsities": "0.9,0.5"}, r"sparsities=\[0.9, 0.5\] decreases \(0.5 after 0.9\); "
                                       "allowed: a non-decreasing list"),
    ({"warmup_sparsities": "0.9", "warmup_unit": "week"},
     "warmup_unit='week' is out of range; allowed: one of 'epoch', 'step'"),
    ({"warmup_unit": "step"}, "warmup_unit='step' goes with warmup_sparsities, which is not given"),
    ({"rampup_step": "50"}, "rampup_step='50' goes with warmup_sparsities"),
    ({"warmup_epochs": "4", "warmup_unit": "step"}, "warmup_unit='step' goes with warmup_sparsities"),
    ({"warmup_sparsities": "0.9", "rampup_step": "5", "warmup_unit": "epoch"},
     "warmup_unit='epoch' with rampup_step, which counts steps; allowed: 'step'"),
    ({"warmup_sparsities": "0.9", "rampup_step": "0"},
     "rampup_step=0 is out of range; allowed: an integer >= 1"),
    ({"warmup_sparsities": "0.9", "rampup_begin_step": "-1"},
     "rampup_begin_step=-1 is out of range; allowed: an integer >= 0"),
    ({"warmup": hc.ExponentialWarmup(2), "warmup_epochs": "4"},
     "keys 'warmup' and 'warmup_epochs' both give the warm-up"),
])
def test_invalid_warmup_strings_are_clear_errors(warmup, message):
    with pytest.raises(ValueError, match=message):
        hc.from_params({"compressor": "dgc", "sparsity": "0.999", **warmup})


def test_list_warmup_to_target_and_order():
    paddle = hc.ListWarmup([0.5, 0.9], begin=1, length=2)
    dgc_ref = hc.ListWarmup([0.5, 0.9], begin=1, length=2, to_target=True)
    assert [paddle.sparsity(t, 0.99) for t in range(5)] == [0.0, 0.5, 0.9, 0.9, 0.9]
    assert [dgc_ref.sparsity(t, 0.99) for t in range(5)] == [0.0, 0.5, 0.9, 0.99, 0.99]
    assert hc.ListWarmup([0.5, 0.5, 0.9]).sparsities == [0.5, 0.5, 0.9]  # holding is allowed
    with pytest.raises(ValueError, match=r"decreases \(0.5 after 0.9\)"):
        hc.ListWarmup([0.9, 0.5])


# ---- command-line strings ----------------------------------------------------------------------
def test_parse_params_keeps_lists_whole():
    text = "compressor=dgc,sparsity=0.999,warmup_sparsities=0.75,0.9375,0.984375,warmup_unit=step"
    assert parse_params(text) == {"compressor": "dgc", "sparsity": "0.999",
                                  "warmup_sparsities": "0.75,0.9375,0.984375",
                                  "warmup_unit": "step"}
    assert hc.from_params(parse_params(text)).warmup.sparsities == [0.75, 0.9375, 0.984375]


@pytest.mark.parametrize("text,message", [
    ("", "'' starts with ''; allowed: key=value pairs"),
    ("dgc,sparsity=0.9", "starts with 'dgc'"),
    ("compressor=dgc,compressor=topk", "key 'compressor' is empty or given twice"),
    ("=dgc", "key '' is empty or given twice"),
])
def test_parse_params_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_params(text)
