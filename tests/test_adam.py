"""The Adam take-over (hvdcompress.adam.frozen.FrozenAdam), issue 20: numpy references of Adam with a
frozen v, of 1-bit Adam (each rank's momentum, sign-compressed with error feedback), under real
Horovod processes at 2 ranks (tests/hvd/torch_adam.py), and the argument checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from adam_reference import (
    LRS,
    WORLD,
    allgather_exchange,
    by_case,
    compressed_allreduce,
    int4_alltoall,
    int8_alltoall,
    int8_mean,
    reference,
    v_steps,
    v_weights,
)
from conftest import run_horovod

import hvdcompress as hc


@pytest.fixture(scope="module")
def runs():
    return by_case(run_horovod("torch_adam.py", np=WORLD, timeout=300))


@pytest.mark.horovod
def test_without_compression_it_is_adamw_then_adamw_with_v_frozen(runs):
    want = reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True)
    for r in range(WORLD):
        got = np.array(runs["none"][r]["weights"], dtype=np.float32)
        np.testing.assert_allclose(got, np.array(want), rtol=1e-5, atol=1e-6)
        # before the freeze it is torch's own AdamW on the averaged gradient
        np.testing.assert_allclose(got[:3], np.array(runs["torch"][r]["weights"][:3]), rtol=1e-5, atol=1e-6)
    # after the freeze it is not: v stops moving
    assert np.abs(np.array(runs["none"][0]["weights"][5]) - np.array(runs["torch"][0]["weights"][5])).max() > 1e-5


@pytest.mark.horovod
def test_onebit_sending_the_momentum_after_the_freeze_matches_numpy(runs):
    want = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                               exchange=allgather_exchange, send="momentum", warmup=int8_mean))
    for r in range(WORLD):
        got = np.array(runs["onebit"][r]["weights"], dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert runs["onebit"][0]["weights"] == runs["onebit"][1]["weights"]
    seen = runs["onebit"][0]
    assert seen["sent"] * 20 < seen["dense"]          # compressed after the freeze
    assert {"adam.m", "adam.v", "residual"} <= set(seen["state"])
    assert seen["compressor_state"]["adam_steps"] == 5


@pytest.mark.horovod
def test_sending_the_gradient_after_the_freeze_by_default_matches_numpy(runs):
    want = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                              exchange=allgather_exchange, send="gradient", warmup=int8_mean))
    momentum = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                                  exchange=allgather_exchange, send="momentum", warmup=int8_mean))
    assert np.abs(want - momentum).max() > 1e-4  # the two placements differ
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["gradient"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.horovod
def test_sending_the_preconditioned_gradient_after_the_freeze_matches_numpy(runs):
    """send="preconditioned": each rank's g_r / (sqrt(v_hat) + eps), error-fed onebit in that
    (update) space, multiplied back after the exchange; not the gradient placement's weights."""
    want = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                              exchange=allgather_exchange, send="preconditioned", warmup=int8_mean))
    gradient = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                                  exchange=allgather_exchange, send="gradient", warmup=int8_mean))
    assert np.abs(want - gradient).max() > 1e-4
    exact = [np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False, send=s))
             for s in ("gradient", "preconditioned")]
    np.testing.assert_allclose(exact[0], exact[1], rtol=1e-5, atol=1e-6)   # uncompressed: the same Adam
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["preconditioned"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.horovod
def test_a_compressed_step_exchanges_in_lr_units_under_a_schedule(runs):
    """With the lr changed before each step (falling, 0 once, rising), each rank sends u·g_r,
    u = lr / L (L = 0.008, the first compressed step's lr; the last u at lr 0), so the residual
    holds a displacement; the rule before (u = 1) gives other weights; L is checkpointed."""
    kwargs = dict(steps=len(LRS), freeze=2, lr=0.0, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                  exchange=allgather_exchange, send="gradient", warmup=int8_mean, lrs=LRS)
    want = np.array(reference(**kwargs))
    before = np.array(reference(**kwargs, units=False))
    assert np.abs(want - before).max() > 1e-5
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["lr_units"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)
    assert runs["lr_units"][0]["weights"] == runs["lr_units"][1]["weights"]
    assert runs["lr_units"][0]["compressor_state"]["adam_lr_unit"] == pytest.approx(0.008)


@pytest.mark.horovod
def test_clip_grad_norm_clips_the_mean_in_v_steps_and_each_rank_by_its_coefficient_after(runs):
    """The v-steps clip the exchanged mean (Horovod's pattern) and keep its coefficient; the
    compressed steps scale each rank's gradient by it (then clip to c·sqrt(N)): not each rank
    clipped to c in every step (the rule before)."""
    want = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True, clip=5.0))
    unclipped = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True))
    each = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True, clip=5.0, clip_each=True))
    assert np.abs(want - unclipped).max() > 1e-4  # the clip acts (gradient norms are ~31)
    assert np.abs(want - each).max() > 1e-4   # and differs from each rank's own clip
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["clip"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.horovod
def test_state_dict_resume_continues_exactly(runs):
    for r in range(WORLD):
        assert runs["resume"][r]["weights"] == runs["onebit"][r]["weights"]


@pytest.mark.horovod
def test_compressed_allreduce_with_worker_and_server_residuals_matches_numpy(runs):
    """1-bit Adam's exchange: error feedback on both sides of the compressed allreduce."""
    want = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False,
                              exchange=compressed_allreduce, send="momentum", warmup=int8_alltoall))
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["a2a"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)
    assert runs["a2a"][0]["weights"] == runs["a2a"][1]["weights"]


@pytest.mark.horovod
def test_the_warm_up_is_int8_by_default_and_dense_with_warmup_none(runs):
    """Around onebit the warm-up's gradients go int8 (4x fewer bytes), decoded and averaged
    before Adam takes them; warmup="none" allreduces them dense as before."""
    kw = dict(lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False, exchange=allgather_exchange)
    dense = np.array(reference(5, 2, **kw))
    int8 = np.array(reference(5, 2, **kw, warmup=int8_mean))
    assert np.abs(dense - int8).max() > 1e-5   # the warm-ups differ
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["dense_warmup"][r]["weights"], dtype=np.float32), dense,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.horovod
def test_the_variance_schedule_matches_numpy_on_both_collectives(runs):
    """FrozenAdam's variance schedule after 4 live steps (int8): v refreshed at 6, 8, ..., 20
    (weight 1 - b2^2), then 24 (1 - b2^4), onebit + EF between; clipped by the v-steps' coefficient."""
    kw = dict(lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False, exchange=allgather_exchange, live=4)
    want = np.array(reference(24, None, **kw, warmup=int8_mean, clip=20.0))
    frozen = np.array(reference(24, 4, **{k: v for k, v in kw.items() if k != "live"}, warmup=int8_mean, clip=20.0))
    assert np.abs(want - frozen).max() > 1e-5   # the refreshes of v act
    assert np.abs(want - np.array(reference(24, None, **kw, warmup=int8_mean))).max() > 1e-5   # so does the clip
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["schedule"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)
    assert runs["schedule"][0]["weights"] == runs["schedule"][1]["weights"]
    seen = runs["schedule"][0]
    # 13 int8 steps (~1/4 of dense), 11 onebit ones (~1/32)
    assert seen["dense"] / seen["sent"] == pytest.approx(24 / (13 / 4 + 11 / 32), rel=0.02)
    assert seen["compressor_state"]["adam_steps"] == 24 and seen["compressor_state"]["adam_beta2"] == 0.95
    a2a = np.array(reference(24, None, **{**kw, "exchange": compressed_allreduce}, warmup=int8_alltoall))
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["schedule_a2a"][r]["weights"], dtype=np.float32), a2a,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.horovod
def test_a_tensor_under_min_numel_runs_live_adam_at_every_step(runs):
    """A tensor under ``min_numel`` elements runs live Adam at every step on the int8 mean (v
    updated with b2, bias correction 1 - b2^t), never the variance schedule's compressed steps;
    clip_grad_norm=20 follows the schedule's steps (the large tensors'): the mean's clip in its
    v-steps, each rank's scaled by its coefficient in the others."""
    kw = dict(lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False, clip=20.0)
    want = np.array(reference(12, None, **kw, live=4, warmup=int8_mean, all_live=True))
    schedule = np.array(reference(12, None, **kw, exchange=allgather_exchange, live=4, warmup=int8_mean))
    assert np.abs(want - schedule).max() > 1e-5   # the schedule would have compressed steps 5, 7, 9, 11
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["small"][r]["weights"], dtype=np.float32), want, rtol=1e-5, atol=1e-6)
    assert runs["small"][0]["weights"] == runs["small"][1]["weights"]
    assert runs["small"][0]["dense"] / runs["small"][0]["sent"] == pytest.approx(4, rel=0.02)   # int8 every step


# ---- the variance schedule (one process) ------------------------------------------------------

def test_the_variance_schedule_matches_its_simulation():
    from hvdcompress.adam.variance import VarianceSchedule
    schedule = VarianceSchedule()
    for b2, in_1000, cap in ((0.95, 199, 16), (0.99, 173, 64), (0.999, 173, 512), (0.9, 247, 8)):
        want = v_steps(5000, b2)
        assert schedule.cap(b2) == cap and max(want.values()) == cap
        assert [t for t in range(1, 5001) if schedule.updates(t, b2)] == sorted(want)
        assert len([t for t in want if t <= 1000]) == in_1000 and schedule.count(1000, b2) == in_1000
        assert [schedule.count(t, b2) for t in (1, 128, 129, 130, 300, 3000)] == \
            [len([s for s in want if s <= t]) for t in (1, 128, 129, 130, 300, 3000)]
        decay = 1.0
        for t in range(1, 5001):
            if t in want:
                assert schedule.interval(t, b2) == want[t]
                keep, alpha = schedule.weights(t, b2)
                assert (keep, alpha) == pytest.approx(v_weights(want[t], b2), rel=1e-12)
                decay *= keep
            assert schedule.decay(t, b2) == pytest.approx(decay, rel=1e-9)
    # a refresh stands for its interval (Adam's decay over it), not bounded to 1/16 of v any more
    assert schedule.weights(130, 0.999)[1] == pytest.approx(1 - 0.999 ** 2)
    assert schedule.weights(600, 0.999)[1] == pytest.approx(1 - 0.999 ** 32)
    assert schedule.weights(600, 0.95)[1] == pytest.approx(1 - 0.95 ** 16)
    assert schedule.weights(3000, 0.999)[1] == pytest.approx(1 - 0.999 ** 256)
    fixed = VarianceSchedule(freeze_steps=7)
    assert [t for t in range(1, 20) if fixed.updates(t, 0.9)] == list(range(1, 8))
    assert fixed.decay(3, 0.9) == 0.9 ** 3 and fixed.decay(30, 0.9) == 0.9 ** 7
    assert VarianceSchedule(freeze_steps=0).decay(5, 0.9) == 0.9


@pytest.mark.parametrize("b2", [0.95, 0.999])
def test_the_default_take_over_matches_numpy_over_the_first_300_steps(b2):
    """after_exchange step by step against the numpy reference at the defaults (one rank, the
    exchanged mean given): the v-steps' weights, the bias correction over them."""
    from adam_reference import N, gradients

    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()))
    settings = AdamSettings(lr=0.01, beta1=0.9, beta2=b2, eps=1e-8, weight_decay=0.1, decoupled=True)
    mean = lambda xs: (xs[0] + xs[1]) * np.float32(1 / WORLD)
    want = reference(300, None, lr=0.01, b1=0.9, b2=b2, wd=0.1, decoupled=True, warmup=mean)
    frozen = reference(300, 128, lr=0.01, b1=0.9, b2=b2, wd=0.1, decoupled=True, warmup=mean)
    assert np.abs(want[-1] - frozen[-1]).max() > 1e-4   # the refreshes after step 128 act
    param, state = torch.linspace(-1, 1, N), {}
    for step in range(300):
        g = torch.from_numpy(mean(gradients(step)))
        adam.before_exchange(ops, g, state, settings, param)
        param = adam.after_exchange(ops, state, param, g, settings)
        adam.on_step()
        np.testing.assert_allclose(param.numpy(), want[step], rtol=1e-5, atol=1e-6)


# ---- arguments (one process) ----------------------------------------------------------------

@pytest.fixture(scope="module")
def hvc():
    import horovod.torch as hvd

    import hvdcompress.torch as hvc
    hvd.init()
    return hvc


@pytest.mark.parametrize("optimizer, message", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1), "allowed: torch.optim.Adam or torch.optim.AdamW"),
    (lambda ps: torch.optim.Adam(ps, amsgrad=True), "amsgrad=True: FrozenAdam runs Adam and AdamW with amsgrad=False only"),
    (lambda ps: torch.optim.AdamW(ps, maximize=True), "maximize=True"),
])
def test_unsupported_optimizers_are_clear_errors(hvc, optimizer, message):
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=message):
        hvc.DistributedOptimizer(optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                 compression=hc.FrozenAdam(hc.OneBit()))


def test_dgc_next_to_adam_warns_that_its_momentum_correction_is_sgds(hvc):
    model = torch.nn.Linear(3, 2)
    with pytest.warns(UserWarning, match="applies SGD's momentum correction.*FrozenAdam"):
        hvc.DistributedOptimizer(torch.optim.AdamW(model.parameters()), named_parameters=model.named_parameters(),
                                 compression=hc.DGC(0.99))


@pytest.mark.parametrize("params, message", [
    ({"compressor": "dgc", "adam": "frozen"}, "applies momentum itself"),
    ({"compressor": "onebit", "adam": "yes"}, "adam='yes' is unknown; allowed: 'none', 'frozen'"),
    ({"compressor": "onebit", "freeze_steps": "10"}, "freeze_steps='10' without adam"),
    ({"compressor": "onebit", "adam": "frozen", "freeze_steps": "-1"}, "freeze_steps"),
    ({"compressor": "onebit", "adam_send": "gradient"}, "adam_send='gradient' without adam"),
    ({"compressor": "onebit", "adam": "frozen", "adam_send": "both"},
     "adam_send='both' is unknown; allowed: 'auto', 'gradient', 'momentum', 'preconditioned'"),
])
def test_from_params_errors(params, message):
    with pytest.raises(ValueError, match=message):
        hc.from_params(params)


def test_from_params_and_defaults():
    c = hc.from_params({"compressor": "topk", "k": "0.01", "ef": "vanilla", "adam": "frozen"})
    assert isinstance(c, hc.FrozenAdam) and isinstance(c.inner, hc.ErrorFeedback)
    # the default: the variance schedule for every compressor and every b2, the warm-up int8;
    # 256 live steps around the sparsifiers (top-k, random-k: delivers_late), 128 around the others
    for inner, live in ((c.inner, 256), (hc.TopK(0.1), 256), (hc.ErrorFeedback(hc.OneBit()), 128),
                        (hc.PowerSGD(2), 128), (hc.Int8(), 128), (hc.QSGD(), 128), (hc.RandomK(0.1), 256),
                        (hc.ErrorFeedback(hc.RandomK(0.01)), 256), (hc.Threshold(0.01), 128)):
        adam = hc.FrozenAdam(inner)
        assert adam.freeze_steps is None and adam.schedule.freeze_steps is None and adam.schedule.warmup == live
        assert isinstance(adam.mild, hc.Int8) and adam.config()["adam_warmup"] == "auto"
    for wide in (hc.NoCompression(), hc.FP16()):   # no coarser than the compressor itself: dense
        assert hc.FrozenAdam(wide).mild is None
    assert not hc.FrozenAdam(hc.OneBit()).live(10) and hc.FrozenAdam(hc.OneBit()).min_numel == 0
    small = hc.from_params({"compressor": "onebit", "adam": "frozen", "adam_min_numel": "4096"})
    assert small.min_numel == 4096 and small.live(4095) and not small.live(4096)
    assert small.config()["adam_min_numel"] == 4096
    with pytest.raises(ValueError, match="adam_min_numel"):
        hc.from_params({"compressor": "onebit", "adam": "frozen", "adam_min_numel": "-1"})
    with pytest.raises(ValueError, match="adam_min_numel=.4096. without adam"):
        hc.from_params({"compressor": "onebit", "adam_min_numel": "4096"})
    assert hc.FrozenAdam(hc.OneBit(), warmup="none").mild is None
    assert isinstance(hc.FrozenAdam(hc.NoCompression(), warmup="int8").mild, hc.Int8)
    fixed = hc.from_params({"compressor": "int8", "adam": "frozen", "freeze_steps": "7", "adam_warmup": "none"})
    assert fixed.schedule.freeze_steps == 7 and fixed.mild is None
    # send="auto": top-k (its k by magnitude) in update space, every other compressor the gradient
    assert c.send == "preconditioned" and hc.FrozenAdam(hc.TopK(0.1)).send == "preconditioned"
    assert hc.FrozenAdam(hc.OneBit()).send == "gradient" and hc.FrozenAdam(hc.RandomK(0.1)).send == "gradient"
    assert hc.FrozenAdam(hc.TopK(0.1), send="gradient").send == "gradient"
    assert hc.from_params({"compressor": "int8", "adam": "frozen", "adam_send": "momentum"}).send == "momentum"
    with pytest.raises(ValueError, match="FrozenAdam: send='m'; allowed: 'auto', 'gradient', 'momentum', 'preconditioned'"):
        hc.FrozenAdam(hc.OneBit(), send="m")
    with pytest.raises(ValueError, match="FrozenAdam: warmup='fp8'; allowed: 'auto', 'int8', 'int4', 'none'"):
        hc.FrozenAdam(hc.OneBit(), warmup="fp8")
    for params, message in (({"compressor": "onebit", "adam_warmup": "int8"}, "adam_warmup='int8' without adam"),
                            ({"compressor": "onebit", "adam": "frozen", "adam_warmup": "x"},
                             "adam_warmup='x' is unknown; allowed: 'auto', 'int8', 'int4', 'none'")):
        with pytest.raises(ValueError, match=message):
            hc.from_params(params)
    c.on_step()
    restored = hc.from_params({"compressor": "topk", "k": "0.01", "ef": "vanilla", "adam": "frozen"})
    restored.load_state_dict(c.state_dict())
    assert restored.steps == 1
    live = hc.from_params({"compressor": "onebit", "adam": "frozen", "adam_live_steps": "4"})
    assert live.schedule.warmup == 4 and live.config()["adam_live_steps"] == 4
    assert hc.FrozenAdam(hc.TopK(0.1), live_steps=128).schedule.warmup == 128   # top-k's 256 overridden


@pytest.mark.parametrize("b2, live, mild", [(0.95, 256, "Int8"), (0.99, 256, "Int8"), (0.998, 256, "Int8"),
                                             (0.9985, 512, "Int4"), (0.999, 512, "Int4")])
@pytest.mark.parametrize("params, short, world", [({"compressor": "topk", "k": "0.01", "ef": "vanilla"}, 256, 2),
                                                  ({"compressor": "powersgd", "rank": "4"}, 128, 2),
                                                  ({"compressor": "onebit", "ef": "vanilla"}, 128, 4)])
def test_the_warm_up_waits_longer_with_int4_where_v_forms_slowly(b2, live, mild, params, short, world):
    """Around top-k and PowerSGD (any number of ranks) and onebit (from 4 ranks) the first step's
    b2 sets W, the warm-up compressor and the first interval after W: 512 live steps sent int4,
    then a v-step every 16th (top-k: 2nd), where 1/(1-b2) > 512, else 256 int8 (top-k) or 128
    int8, then every 2nd; a checkpoint brings them back with b2. Onebit at 2 ranks, the other compressors,
    live_steps, freeze_steps and an explicit warmup keep theirs."""
    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.adam.variance import long_warmup
    live = live if live == 512 else short
    first = 16 if live == 512 and params["compressor"] != "topk" else 2
    settings = AdamSettings(lr=1e-3, beta1=0.9, beta2=b2, eps=1e-8)
    adam = hc.from_params({**params, "adam": "frozen"})
    assert adam.schedule.warmup == short and type(adam.mild).__name__ == "Int8"   # before the first step
    adam.frozen(settings)
    adam.set_world(world)   # the driver's, when it builds its engine
    assert long_warmup(b2, short) == live and adam.schedule.warmup == live and type(adam.mild).__name__ == mild
    assert [t for t in range(live, live + first + 1) if adam.schedule.updates(t, b2)] == [live, live + first]
    adam.on_step()
    restored = hc.from_params({**params, "adam": "frozen"})
    restored.set_world(world)
    restored.load_state_dict(adam.state_dict())
    assert restored.schedule.warmup == live and type(restored.mild).__name__ == mild
    live = long_warmup(b2, 256)   # top-k's, below
    for other, want in ((hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit())), (128, "Int8")),
                        (hc.FrozenAdam(hc.Int8()), (128, "Int8")),
                        (hc.FrozenAdam(hc.TopK(0.01), live_steps=300), (300, "Int8")),
                        (hc.FrozenAdam(hc.TopK(0.01), warmup="int8"), (live, "Int8")),
                        (hc.FrozenAdam(hc.TopK(0.01), warmup="none"), (live, "NoneType")),
                        (hc.FrozenAdam(hc.OneBit(), warmup="int4"), (128, "Int4"))):
        other.frozen(settings)
        other.set_world(2)
        assert (other.schedule.warmup, type(other.mild).__name__) == want
    fixed = hc.FrozenAdam(hc.TopK(0.01), freeze_steps=3)
    fixed.frozen(settings)
    assert type(fixed.mild).__name__ == "Int8" and fixed.schedule.count(1000, b2) == 3
    with pytest.raises(ValueError, match="world=0"):
        fixed.set_world(0)


@pytest.mark.horovod
def test_the_compressed_allreduce_re_sends_an_int4_v_step_in_chunks_of_64(runs):
    """An int4 v-step through the compressed allreduce: each rank's segment 4-bit, the reduced
    sum 4-bit again in chunks of 64 (its error lands on the mean whole, the ranks' averaged)."""
    kw = dict(lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=False, exchange=compressed_allreduce, live=4)
    want = np.array(reference(8, None, **kw, warmup=int4_alltoall))
    assert np.abs(want - np.array(reference(8, None, **kw, warmup=lambda s: int4_alltoall(s, 2048)))).max() > 1e-5
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["int4_a2a"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)
    assert runs["int4_a2a"][0]["weights"] == runs["int4_a2a"][1]["weights"]


def test_an_int4_v_step_sends_half_a_byte_per_element():
    """The long warm-up's v-steps: 4-bit min-max codes, decoded within half of their 15 steps."""
    from hvdcompress.contract.compressor import TensorInfo
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.TopK(0.1)), warmup="int4")
    info, state = TensorInfo(name="w", numel=1001), {}
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(1001).astype(np.float32))
    adam.init_state(ops, x, state, info)
    packet = adam.compress(ops, x, state, info)
    assert packet.tensors[0].dtype == torch.uint8 and packet.tensors[0].numel() == 501
    back = adam.decompress(ops, packet.tensors, packet.ctx, info).numpy()
    assert np.abs(back - x.numpy()).max() <= (x.max() - x.min()).item() / 30 * 1.001
    assert "residual" not in state or state["residual"].abs().sum() == 0   # top-k not called


def test_a_coordinate_without_gradient_in_the_warm_up_is_not_moved_after_the_freeze():
    """v = 0 at the freeze (an always-zero input pixel): onebit sends ±scale for its zero
    gradient, and m / (sqrt(0) + eps) would move it by lr·scale/eps (NaN on digits); it stays,
    while the other coordinates take the frozen-Adam step."""
    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=1)  # v-steps: t = 1
    settings = AdamSettings(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
    param = torch.tensor([0.5, 0.5])
    state = {"adam.m": torch.zeros(2), "adam.v": torch.zeros(2)}
    param = adam.after_exchange(ops, state, param, torch.tensor([0.0, 0.2]), settings)  # warm-up
    adam.on_step()
    assert adam.frozen(settings) and state["adam.v"][0] == 0 and state["adam.v"][1] > 0
    moved = param.clone()
    after = adam.after_exchange(ops, state, param, torch.tensor([0.3, 0.3]), settings)  # ±scale
    assert after[0] == moved[0]                       # without the rule: 0.5 - 1e-3·0.03/1e-8·... = -3e3
    m, v = state["adam.m"][1].item(), state["adam.v"][1].item()
    expected = moved[1].item() - 1e-3 * (m / (1 - 0.9 ** 2)) / (np.sqrt(v / (1 - 0.999)) + 1e-8)
    assert after[1].item() == pytest.approx(expected, rel=1e-6)


def test_a_v_step_sends_int8_and_leaves_the_residual():
    """In a v-step the wrapped compressor is not called: int8 sends the gradient (decoded within
    its rounding) and the error-feedback residual waits for the next compressed step."""
    from adam_reference import int8_decoded

    from hvdcompress.contract.compressor import TensorInfo
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.TopK(0.1)), live_steps=1)
    info, state = TensorInfo(name="w", numel=100), {}
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(100).astype(np.float32))
    adam.init_state(ops, x, state, info)
    adam.on_step()                                   # step 2: compressed (v-steps 1, 3, 5, ...)
    assert adam.frozen()
    adam.compress(ops, x, state, info)
    residual = state["residual"].clone()
    assert residual.abs().sum() > 0
    adam.on_step()                                   # step 3: a v-step
    assert not adam.frozen() and not adam.sends_dense()
    packet = adam.compress(ops, x, state, info)
    want = int8_decoded(x.numpy())
    np.testing.assert_allclose(adam.decompress(ops, packet.tensors, packet.ctx, info).numpy(), want, rtol=1e-6, atol=1e-6)
    assert packet.tensors[0].dtype == torch.uint8
    assert torch.equal(state["residual"], residual)


def test_the_unit_follows_the_lr_of_the_compressed_steps_and_is_checkpointed():
    """before_exchange sends u·x, u = lr / L (L the first compressed step's lr, kept in the
    compressor's state_dict), the last u at lr 0; after_exchange divides the mean by u; a new
    FrozenAdam loaded from the state_dict keeps L; an adam_lr_unit of 0 (none yet) sets it anew."""
    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=1)
    x, w, state = torch.full((4,), 2.0), torch.zeros(4), {}
    adam.before_exchange(ops, x, state, AdamSettings(lr=0.5, beta1=0.9, beta2=0.99, eps=1e-8), w)
    adam.after_exchange(ops, state, w, x, AdamSettings(lr=0.5, beta1=0.9, beta2=0.99, eps=1e-8))
    adam.on_step()                                   # a v-step: sent as it is, L not set
    assert adam.lr_unit is None
    sent = []
    for lr in (0.2, 0.1, 0.0, 0.4):
        settings = AdamSettings(lr=lr, beta1=0.9, beta2=0.99, eps=1e-8)
        sent.append(adam.before_exchange(ops, x, state, settings, w))
        m = state["adam.m"].clone()
        adam.after_exchange(ops, state, w, sent[-1], settings)
        torch.testing.assert_close(state["adam.m"], m * 0.9 + x * 0.1)   # m saw the gradient, not u·x
        adam.on_step()
    assert [s[0].item() for s in sent] == [2.0, 1.0, 1.0, 4.0]
    saved = adam.state_dict()
    assert saved["adam_lr_unit"] == 0.2
    again = hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=1)
    again.load_state_dict(saved)
    assert again.lr_unit == 0.2
    again.load_state_dict({**saved, "adam_lr_unit": 0.0})
    assert again.lr_unit is None


def test_the_step_driver_gives_its_world_to_the_take_over_when_it_builds_its_engine():
    """Onebit's warm-up follows the number of ranks: the driver sets it with each engine it
    builds (again after a rebuild at another size), so 4 ranks at b2 0.999 wait 512 int4 steps
    and 2 ranks 128 int8."""
    from types import SimpleNamespace

    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.engines.accounting import ByteCount
    from hvdcompress.step.driver import StepDriver
    from hvdcompress.step.options import parse_options
    from hvdcompress.torch.tensors import OPS

    adam = hc.from_params({"compressor": "onebit", "ef": "vanilla", "adam": "frozen"})
    world = {"n": 4}
    driver = StepDriver(parse_options(adam, op="avg", average_op="avg", sum_op="sum"), OPS,
                        engine=lambda: SimpleNamespace(total_bytes=ByteCount()),
                        comm=lambda: SimpleNamespace(world=world["n"]), who="test", adam=adam)
    adam.frozen(AdamSettings(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8))
    assert adam.schedule.warmup == 128 and adam.world is None   # no engine yet
    driver.engine
    assert (adam.world, adam.schedule.warmup, adam.schedule.first, type(adam.mild).__name__) == (4, 512, 16, "Int4")
    world["n"] = 2
    driver.rebuild()
    driver.engine
    assert (adam.world, adam.schedule.warmup, adam.schedule.first, type(adam.mild).__name__) == (2, 128, 2, "Int8")


@pytest.mark.parametrize("inner, decays, warns", [
    (lambda: hc.ErrorFeedback(hc.TopK(0.01)), False, True),
    (lambda: hc.ErrorFeedback(hc.TopK(0.01)), True, False),
    (lambda: hc.ErrorFeedback(hc.RandomK(0.01)), False, True),
    (lambda: hc.ErrorFeedback(hc.OneBit()), False, False),
])
def test_top_k_warns_once_when_the_lr_has_not_decayed_by_the_long_warm_up(inner, decays, warns):
    """A constant lr through step 512 warns once around top-k and random-k (what delivers late);
    a decaying one, or onebit, does not."""
    import warnings

    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.adam.variance import LONG_WARMUP
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(inner(), freeze_steps=1)
    x, w, state = torch.full((4,), 2.0), torch.zeros(4), {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, LONG_WARMUP + 20):
            lr = 0.1 * (1.0 - t / 2000.0) if decays else 0.1
            adam.before_exchange(ops, x, state, AdamSettings(lr=lr, beta1=0.9, beta2=0.99, eps=1e-8), w)
            adam.on_step()
    found = [c for c in caught if "learning rate has stayed" in str(c.message)]
    assert len(found) == (1 if warns else 0)
    if warns:
        assert type(inner().unwrap()).__name__ in str(found[0].message) and "0.1" in str(found[0].message)


@pytest.mark.parametrize("decays, warns", [(True, False), (False, True)])
def test_top_k_decay_check_waits_for_the_lr_to_move_after_the_long_warm_up(decays, warns):
    """At b2 0.999 top-k's first compressed step is 513: a cosine lr is checked after it has had
    time to move (no warning), a constant one still warns once."""
    import math
    import warnings

    from hvdcompress.adam.settings import AdamSettings
    from hvdcompress.ops.torch_ops import TorchOps
    ops, adam = TorchOps(), hc.FrozenAdam(hc.ErrorFeedback(hc.TopK(0.01)))
    x, w, state = torch.full((4,), 2.0), torch.zeros(4), {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, 1001):
            lr = 0.001 * 0.5 * (1.0 + math.cos(math.pi * t / 1000)) if decays else 0.001
            settings = AdamSettings(lr=lr, beta1=0.9, beta2=0.999, eps=1e-8)
            adam.before_exchange(ops, x, state, settings, w)
            adam.on_step()
    assert adam.schedule.warmup == 512
    found = [c for c in caught if "learning rate has stayed" in str(c.message)]
    assert len(found) == (1 if warns else 0)
