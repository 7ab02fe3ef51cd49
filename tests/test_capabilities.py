"""Explicit capabilities: ``explicit_momentum``, the warm-up interface found through
``unwrap()``, and the one module that derives random keys (:mod:`hvdcompress.contract.keys`), pinned to
the values the per-compressor derivations of 7bd925a gave."""
import numpy as np
import pytest

import hvdcompress
from hvdcompress.compressors.csc import CSC
from hvdcompress.compressors.dgc import DGC
from hvdcompress.compressors.topk import TopK
from hvdcompress.contract import keys
from hvdcompress.contract.memory import ErrorFeedback, Momentum
from hvdcompress.contract.schedule import ExponentialWarmup, SparsityScheduler


@pytest.mark.parametrize("compressor, expected", [
    (DGC(0.99), None), (DGC(0.99, momentum=0.9), 0.9), (CSC(momentum=0.5), 0.5),
    (Momentum(TopK(0.1)), None), (Momentum(TopK(0.1), mu=0.8), 0.8),
    (ErrorFeedback(TopK(0.1)), None), (TopK(0.1), None)])
def test_explicit_momentum(compressor, expected):
    assert compressor.explicit_momentum == expected


def test_from_params_momentum_is_explicit():
    c = hvdcompress.from_params({"compressor": "topk", "k": "0.1", "momentum": "plain",
                                 "momentum_mu": "0.7"})
    assert c.explicit_momentum == pytest.approx(0.7)


def test_warmup_found_through_decorators():
    dgc = DGC(0.99, warmup=ExponentialWarmup(2, unit="epoch"))
    assert dgc.supports_warmup and not TopK(0.1).supports_warmup
    sched = SparsityScheduler(dgc)
    assert sched.get_sparsity() == pytest.approx(1 - 0.01 ** 0.5)  # epoch 0 of 2: density 0.01^(1/2)
    sched.step()
    assert sched.get_sparsity() == pytest.approx(0.99)
    assert SparsityScheduler(ErrorFeedback(TopK(0.1))).get_sparsity() is None
    assert SparsityScheduler(Momentum(CSC(ratio=0.25))).get_sparsity() == pytest.approx(0.75)


def test_scheduler_rejects_non_compressors():
    with pytest.raises(TypeError, match="neither a compressor nor an hvdcompress optimizer"):
        SparsityScheduler(object())


def test_keys_match_the_previous_derivations():
    state = {}
    got = [keys.next_rank_key(7, state, "layer.w", rank) for rank in (0, 1, 3)]
    assert got == [3400293513, 1138766203, 1056708892] and state == {"step": 3}  # quant.next_key
    assert keys.step_key(7, 5, "layer.w") == 2151356870  # DGC's sample start key
    q = keys.generator(7, keys.tensor_id("layer.w")).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(q, np.float32([0.10481088608503342, 0.08937598019838333,
                                                 -0.3691730797290802]))  # PowerSGD's warm-start Q
    q = keys.generator(7, keys.tensor_id("layer.w"), 4).standard_normal(2).astype(np.float32)
    np.testing.assert_array_equal(q, np.float32([-0.9382971525192261, 1.8462153673171997]))


def test_rank_keys_are_distinct_32_bit():
    base = keys.step_key(0, 0, "x")
    ranked = {keys.rank_key(base, r) for r in range(1024)}
    assert len(ranked) == 1024 and all(0 <= k < 2 ** 32 for k in ranked)
    assert keys.rank_key(base, 0) == base


def test_advance_step_counts_from_zero():
    state = {}
    assert [keys.advance_step(state) for _ in range(3)] == [0, 1, 2] and state["step"] == 3


def test_the_adam_take_over_never_changes_the_compressor_it_is_given():
    """FrozenAdam runs onebit with a scale per row (``for_adam``) on a copy of the tree."""
    given = ErrorFeedback(hvdcompress.OneBit())
    adam = hvdcompress.FrozenAdam(given)
    assert given.unwrap().chunk == "auto" and adam.unwrap().chunk == "rows"
    assert adam.inner is not given and type(adam.inner) is ErrorFeedback
    chosen = ErrorFeedback(hvdcompress.OneBit(chunk=64))
    assert hvdcompress.FrozenAdam(chosen).inner is chosen   # nothing to configure: the same tree


def test_the_take_over_reads_declared_needs_not_class_names():
    """A compressor outside the package that declares top-k's needs gets top-k's policy."""
    from hvdcompress.contract.compressor import AdamNeeds

    class Mine(TopK):
        name = "mine_not_registered"

    class Plain(hvdcompress.Compressor):
        name = "plain_not_registered"

        def compress(self, ops, x, state, info):
            return hvdcompress.Packet([x], None, summable=True)

        def decompress(self, ops, tensors, ctx, info, out=None):
            return tensors[0]

    assert hvdcompress.FrozenAdam(Mine(0.1)).send == "preconditioned"
    assert hvdcompress.FrozenAdam(Plain()).send == "gradient"
    Plain.adam_needs = AdamNeeds(selects_by_magnitude=True)
    assert hvdcompress.FrozenAdam(Plain()).send == "preconditioned"
    assert hvdcompress.FrozenAdam(Plain()).schedule.warmup == 128
    # what delivers late (a sparsifier's error feedback) gets the sparsifiers' 256 live steps, and
    # after the long warm-up (b2 0.999) refreshes that start 2 apart, not 16
    for late, warmup, first in ((True, 256, 2), (False, 128, 16)):
        Plain.adam_needs = AdamNeeds(delivers_late=late, long_warmup_ranks=1)
        adam = hvdcompress.FrozenAdam(Plain())
        assert adam.send == "gradient" and adam.schedule.warmup == warmup
        adam._follow(0.999)
        assert (adam.schedule.warmup, adam.schedule.first) == (512, first)


def test_the_sharded_reduce_scatter_takes_what_declares_a_fixed_size_payload():
    from hvdcompress.engines.reduce_scatter import check_sharded

    class Fixed(TopK):
        name = "fixed_not_registered"

    class Varying(TopK):
        name = "varying_not_registered"
        fixed_size_payload = False

    assert check_sharded(ErrorFeedback(Fixed(0.1))).unwrap().name == "fixed_not_registered"
    with pytest.raises(ValueError, match="fixed_size_payload"):
        check_sharded(Varying(0.1))
    with pytest.raises(ValueError, match="takes the optimizer's momentum or Adam over"):
        check_sharded(hvdcompress.FrozenAdam(TopK(0.1)))


def test_the_sharded_reduce_scatter_warns_for_what_does_not_declare_keeps_precision():
    """Onebit and top-k (what drops or signs most of each element) converged far from dense
    under FSDP (benchmarks/README.md section 11): a warning naming the compressor; the
    compressors that declare keeps_precision (int8, fp16, bf16, none) and a user's own that
    declares it pass silently."""
    import warnings

    from hvdcompress.engines.reduce_scatter import check_sharded

    class Precise(TopK):
        name = "precise_not_registered"
        keeps_precision = True

    for c in (ErrorFeedback(hvdcompress.OneBit()), ErrorFeedback(TopK(0.05)), hvdcompress.Int4()):
        with pytest.warns(UserWarning, match="drops or signs most of each element"):
            check_sharded(c)
    for c in (hvdcompress.Int8(), hvdcompress.FP16(), hvdcompress.BF16(), hvdcompress.NoCompression(), Precise(0.1)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_sharded(c)
