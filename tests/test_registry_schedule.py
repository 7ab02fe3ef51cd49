"""from_params, argument validation and warm-up schedules."""
from __future__ import annotations

import pytest

import hvdcompress as hc


def test_from_params_builds_decorated_compressor():
    comp = hc.from_params({"compressor": "topk", "k": "0.01", "ef": "vanilla",
                           "momentum": "nesterov"})
    assert isinstance(comp, hc.Momentum) and comp.nesterov and comp.mu is None
    assert isinstance(comp.inner, hc.ErrorFeedback)
    assert isinstance(comp.inner.inner, hc.TopK) and comp.inner.inner.k == 0.01


def test_from_params_types_and_counts():
    assert hc.from_params({"compressor": "topk", "k": "100"}).k == 100
    assert hc.from_params({"compressor": "topk", "k": 0.5}).k == 0.5
    rk = hc.from_params({"compressor": "randomk", "k": "0.1", "seed": "7", "scale": "true"})
    assert rk.seed == 7 and rk.scale is True


def test_from_params_dgc_momentum_is_built_in():
    dgc = hc.from_params({"compressor": "dgc", "sparsity": "0.999", "momentum": "nesterov",
                          "momentum_mu": "0.9", "clip_norm": "none"})
    assert isinstance(dgc, hc.DGC) and dgc.nesterov is True and dgc.momentum == 0.9
    assert dgc.clip_norm is None


@pytest.mark.parametrize("params,message", [
    ({}, "'compressor' is missing; allowed: bf16, .*dgc, .*topk"),
    ({"compressor": "zip"}, "compressor='zip' is unknown; allowed: .*topk"),
    ({"compressor": "topk", "kk": "1"}, "key 'kk' .* not a parameter of topk; allowed keys: .*k"),
    ({"compressor": "topk", "k": "2.5"}, r"k=2.5 is out of range; allowed: a number in \(0.0, 1.0\]"),
    ({"compressor": "topk", "k": "0"}, "k=0 is out of range; allowed: an integer >= 1"),
    ({"compressor": "topk", "k": "lots"}, "k='lots' cannot be read as int or float"),
    ({"compressor": "dgc", "sparsity": "1.0"}, r"sparsity=1.0 is out of range; allowed: a number in \[0.0, 1.0\)"),
    ({"compressor": "dgc", "ef": "vanilla"}, "ef='vanilla' with compressor='dgc'"),
    ({"compressor": "topk", "ef": "fancy"}, "ef='fancy' is unknown; allowed: 'none', 'vanilla'"),
    ({"compressor": "topk", "momentum": "heavy"}, "momentum='heavy' is unknown"),
    ({"compressor": "topk", "seed": "x"}, "key 'seed' .* not a parameter of topk"),
    ({"compressor": "randomk", "seed": "-1"}, "seed=-1 is out of range; allowed: an integer >= 0"),
])
def test_from_params_errors_name_key_value_and_allowed(params, message):
    with pytest.raises(ValueError, match=message):
        hc.from_params(params)


def test_constructor_errors():
    with pytest.raises(ValueError, match="DGC: momentum=1.5"):
        hc.DGC(0.9, momentum=1.5)
    with pytest.raises(ValueError, match="DGC: warmup=5 is not a schedule"):
        hc.DGC(0.9, warmup=5)
    with pytest.raises(TypeError, match="ErrorFeedback wraps a Compressor"):
        hc.ErrorFeedback("topk")


def test_exponential_warmup_follows_dgc_paper():
    sched = hc.ExponentialWarmup(5)
    got = [sched.sparsity(e, 0.999) for e in range(7)]
    density = [0.001 ** ((e + 1) / 5) for e in range(5)]
    assert got[:5] == pytest.approx([1 - d for d in density])
    assert got[0] == pytest.approx(0.749, abs=2e-3) and got[3] == pytest.approx(0.996, abs=1e-3)
    assert got[5:] == [0.999, 0.999]


def test_list_warmup_follows_paddle():
    sched = hc.ListWarmup([0.75, 0.9375, 0.984375, 0.996, 0.999], begin=10, length=50)
    assert [sched.sparsity(t, 0.5) for t in (0, 9, 10, 19, 20, 59, 60, 1000)] == \
        [0.0, 0.0, 0.75, 0.75, 0.9375, 0.999, 0.999, 0.999]
    with pytest.raises(ValueError, match="sparsities=\\[\\] is empty"):
        hc.ListWarmup([])
    with pytest.raises(ValueError, match="unit='week'"):
        hc.ListWarmup([0.9], unit="week")


def test_dgc_warmup_by_step_and_by_epoch():
    by_step = hc.DGC(0.999, warmup=hc.ListWarmup([0.9, 0.99], begin=1, length=2, unit="step"))
    seen = []
    for _ in range(4):
        seen.append(by_step.current_sparsity)
        by_step.on_step()
    assert seen == [0.0, 0.9, 0.99, 0.99]
    by_epoch = hc.DGC(0.999, warmup=hc.ExponentialWarmup(2))
    sched = hc.SparsityScheduler(by_epoch)
    first = sched.get_sparsity()
    sched.step()
    sched.step()
    assert first == pytest.approx(1 - 0.001 ** 0.5) and sched.get_sparsity() == 0.999
    restored = hc.SparsityScheduler(hc.DGC(0.999, warmup=hc.ExponentialWarmup(2)))
    restored.load_state_dict(sched.state_dict())
    assert restored.get_sparsity() == 0.999


def test_scheduler_rejects_other_objects():
    with pytest.raises(TypeError, match="neither a compressor"):
        hc.SparsityScheduler(object())


def test_from_params_builds_compressors_without_arguments():
    assert isinstance(hc.from_params({"compressor": "none"}), hc.NoCompression)
    with pytest.raises(ValueError, match="key 'k' .* not a parameter of fp16"):
        hc.from_params({"compressor": "fp16", "k": "1"})
