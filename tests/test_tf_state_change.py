"""Issue 24 on TensorFlow / Keras: state under change.

1. Loss scaling (tests/tf_state/amp.py, 2 ranks): the tape's ``scaler=`` gives the weights of
   the run without a loss scale; an overflow on one rank leaves every rank's compressor state
   as it was (tape, and the Keras optimizer around a LossScaleOptimizer), the scale is lowered
   on every rank, and the run continues as if that step's batches had not been there; the
   Keras optimizer around a LossScaleOptimizer in ``model.fit`` gives the weights of the run
   without it bit for bit (tests/tf_state/keras_lso.py).
2. Resume at another world size (tests/tf_state/resume.py): the compressor state gathered at 2
   ranks (Keras optimizer: onebit + EF, the compressed allreduce at 3; tape: DGC's momentum and
   velocity) is loaded at 3 ranks; the delivered mass Σ_r e_r / P is kept (numpy reference
   below, not hvdcompress.state.reshard's code), every new rank holds the same share, the large
   kernel's collective is planned again for 3 ranks, and one rank's state is refused.
3. Elastic (tests/tf_state/elastic.py): one elastic horovodrun on this host, 2 ranks grown to 3
   and shrunk to 2 through tests/hvd/elastic_discovery.sh, with
   hvdcompress.tensorflow.elastic.TensorFlowKerasState: no hang (bounded launch), identical
   replicas at every batch, the kernel's collective follows the world size, and after each
   reset every rank holds the share of the last commit's state that the rule defines.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_elastic, run_horovod
from test_reshard import check_reset_states, check_shares, load_states

import hvdcompress as hc
import hvdcompress.tensorflow as hvc

WORKERS = Path(__file__).parent / "tf_state"


def _tape() -> tf.GradientTape:
    with tf.GradientTape() as t:
        pass
    return t


@pytest.mark.parametrize("scaler,message", [
    (tf.keras.optimizers.SGD(0.1), r"scaler=.*allowed: None or a keras.*LossScaleOptimizer"),
    (2.0 ** 10, r"scaler=1024.0: allowed: None or a keras.*LossScaleOptimizer"),
])
def test_tape_scaler_is_checked(scaler, message):
    with pytest.raises(ValueError, match=message):
        hvc.DistributedGradientTape(_tape(), compression=hc.TopK(0.1), scaler=scaler)


# ---- 1. loss scaling ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank launch: amp.py's cases, then resume.py's save (tests/tf_state/two_ranks.py)."""
    work = tmp_path_factory.mktemp("tf_state")
    return work, run_horovod(WORKERS / "two_ranks.py", np=2, args=[str(work)], timeout=300)


KERAS2 = not getattr(tf.keras, "__version__", "2").startswith("3")  # TF 2.15 tf.keras: no __version__


def test_tape_takes_keras2_loss_scale_optimizer_and_refuses_keras3s():
    """Keras 2's LossScaleOptimizer is the tape's scaler (the cases below); Keras 3's unscales
    inside apply_gradients, so the tape's scaler= would unscale twice: refused, naming why."""
    scaler = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
    if KERAS2:
        tape = hvc.DistributedGradientTape(_tape(), compression=hc.TopK(0.1), scaler=scaler)
        assert tape.exchange is not None
    else:
        with pytest.raises(ValueError, match="Keras 3's unscales inside apply_gradients"):
            hvc.DistributedGradientTape(_tape(), compression=hc.TopK(0.1), scaler=scaler)


@pytest.fixture(scope="module")
def amp(two_ranks):
    if not KERAS2:
        pytest.skip("Keras 3: the loss-scaling cases need Keras 2's LossScaleOptimizer "
                    "(Keras 3's is refused: test_tape_takes_keras2_loss_scale_optimizer_and_refuses_keras3s)")
    by_case: dict = {}
    for r in two_ranks[1]:
        by_case.setdefault(r["case"], []).append(r)
    return by_case


@pytest.mark.horovod
@pytest.mark.parametrize("case", ["tape_topk_ef", "tape_dgc"])
def test_tape_scaler_equals_the_unscaled_run(amp, case):
    runs = amp[case]
    assert len(runs) == 2 and runs[0]["checksum"] == runs[1]["checksum"], runs
    # the scale is a power of two: unscaling is exact, so within float rounding is 0 here
    assert runs[0]["gap"] <= 1e-6, runs[0]["gap"]


@pytest.mark.horovod
def test_without_scaler_the_comparison_fails(amp):
    """Horovod's pattern (unscale after the exchange) ends far from the unscaled run: the
    comparison above can fail."""
    assert amp["tape_topk_ef_horovod"][0]["gap"] > 0.01


@pytest.mark.horovod
@pytest.mark.parametrize("case", ["tape_topk_ef_overflow", "tape_dgc_overflow",
                                  "keras_topk_ef_overflow", "keras_dgc_overflow"])
def test_overflow_on_one_rank_leaves_the_state_and_skips_everywhere(amp, case):
    runs = amp[case]
    assert len(runs) == 2 and runs[0]["checksum"] == runs[1]["checksum"], runs
    for r in runs:
        assert r["keys"] > 0 and r["same_keys"], r
        assert r["state_diff"] == 0.0, r          # residuals, momenta, counters: bit for bit
        assert r["weights_diff"] == 0.0, r        # the step was skipped
        assert r["scale_after"] == r["scale_before"] / 2, r
        assert r["gap_skip"] == 0.0, r            # as if the step's batches had not been there


@pytest.mark.horovod
@pytest.mark.parametrize("case", ["keras_lso_topk_ef", "keras_lso_powersgd", "keras_lso_onebit_ef"])
def test_keras_loss_scale_optimizer_inside_equals_the_unscaled_run(amp, case):
    """tests/tf_state/keras_lso.py: ``DistributedOptimizer(LossScaleOptimizer(SGD))`` in
    ``model.fit`` gives the weights of ``DistributedOptimizer(SGD)`` bit for bit."""
    runs = amp[case]
    assert len(runs) == 2 and runs[0]["checksum"] == runs[1]["checksum"], runs
    for r in runs:
        assert r["gap"] == 0.0 and r["scale"] == 2.0 ** 20, r   # 2^10 doubled 10 times in 30 steps


# ---- 2. resume at another world size ---------------------------------------------------------------
SIZES = {"dense/kernel": 1000, "dense/bias": 50, "dense_1/kernel": 200, "dense_1/bias": 4}


def by_short_name(states: dict) -> dict:
    """``states`` keyed ``dense/kernel`` (Keras 3 names variables by path: ``sequential/dense/kernel``)."""
    return {"/".join(name.split("/")[-2:]): st for name, st in states.items()}


@pytest.fixture(scope="module")
def resumed(two_ranks):
    work, records = two_ranks
    saved = [r for r in records if r["case"] in ("keras", "tape")]
    loaded = run_horovod(WORKERS / "resume.py", np=3, args=[str(work), "load"], timeout=300)
    return work, saved, loaded


@pytest.mark.horovod
@pytest.mark.parametrize("case,keys", [("keras", {"residual"}), ("tape", {"momentum", "velocity"})])
def test_resume_at_three_ranks_keeps_the_delivered_mass(resumed, case, keys):
    work, _, _ = resumed
    with open(work / f"{case}.pkl", "rb") as f:
        gathered = pickle.load(f)
    assert gathered["world"] == 2 and gathered["average"] is True
    old = [load_states(work / f"{case}.save.rank{r}.npz") for r in range(2)]
    for r in range(2):   # the gathered state is every rank's own
        for name, st in old[r].items():
            for key, value in st.items():
                np.testing.assert_array_equal(by_short_name(gathered["ranks"][r])[name][key], value)
    new = [load_states(work / f"{case}.load.rank{r}.npz") for r in range(3)]
    for name, n in SIZES.items():
        for key in sorted(keys):
            assert np.abs(check_shares(old, new, name, key, n)).max() > 0, (name, key)
    if case == "keras":   # the compressed allreduce's layout at 3 ranks
        assert "seg2.residual" in new[0]["dense/kernel"] and "residual" in new[0]["dense/bias"]


@pytest.mark.horovod
def test_resume_plans_again_and_refuses_one_rank(resumed):
    _, saved, loaded = resumed
    plans = {(r["world"], r["case"]): r["plan"] for r in saved + loaded}
    assert plans[(2, "keras")]["dense/kernel"] == "allgather"
    assert plans[(3, "keras")]["dense/kernel"] == "alltoall"
    assert len(loaded) == 6 and all("gather_compression_state" in r["refused"] for r in loaded), loaded[0]


def test_load_checks_its_arguments():
    with pytest.raises(TypeError, match=r"target=3: allowed: an hvdcompress.tensorflow.keras"):
        hvc.gather_compression_state(3)
    with pytest.raises(ValueError, match=r"saved must be what gather_compression_state returned"):
        hvc.load_compression_state(hc.TopK(0.1), {"tensors": {}})
    with pytest.raises(ValueError, match=r"variables= with target=.*allowed only with a DistributedOptimizer"):
        hvc.load_compression_state(hc.TopK(0.1), {"compressor": {}, "ranks": []}, variables=[])


# ---- 3. elastic -----------------------------------------------------------------------------------
ELASTIC_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    """The TF worker's elastic launch (conftest.run_elastic): its directory and every record."""
    work = tmp_path_factory.mktemp("tf_elastic")
    return work, run_elastic(work, WORKERS / "elastic.py", ELASTIC_TIMEOUT_S)


@pytest.mark.horovod
def test_elastic_grows_and_shrinks_with_identical_replicas(elastic):
    _, records = elastic
    steps = [r for r in records if r["event"] == "step"]
    expected = {b: 2 if b <= 3 else 3 if b <= 6 else 2 for b in range(1, 9)}
    assert sorted({r["batch"] for r in steps}) == sorted(expected), "every batch ran"
    for batch, world in expected.items():
        ranks = [r for r in steps if r["batch"] == batch]
        assert sorted(r["rank"] for r in ranks) == list(range(world)), (batch, ranks)
        assert {(r["world"], r["collective"]) for r in ranks} == \
            {(world, "alltoall" if world == 3 else "allgather")}, (batch, ranks)
        assert len({r["digest"] for r in ranks}) == 1, f"replicas differ at batch {batch}"


@pytest.mark.horovod
def test_elastic_state_follows_the_rule_at_each_reset(elastic):
    work, records = elastic
    check_reset_states(work, records, [(3, 2, 3), (6, 3, 2)], SIZES, {"residual"})
