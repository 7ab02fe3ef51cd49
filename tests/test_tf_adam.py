"""The Adam take-over on Keras (hvdcompress.tensorflow.keras.DistributedOptimizer with a Keras
AdamW around FrozenAdam), under horovodrun at 2 ranks, against the numpy references of
tests/adam_reference.py (shared with the torch tests); and its argument checks."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from adam_reference import LRS, WORLD, allgather_exchange, by_case, int8_mean, reference
from conftest import run_horovod

import hvdcompress as hc
import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck


@pytest.fixture(scope="module")
def runs():
    return by_case(run_horovod("tf_adam.py", np=WORLD, timeout=300))


@pytest.mark.horovod
def test_keras_adamw_take_over_matches_numpy_eager_and_in_a_tf_function(runs):
    """Fixed freezes (int8 warm-up around onebit), the default variance schedule after 4 live
    steps, a tensor under min_numel (live Adam at every step), the lr units under a changing lr:
    the same rules as the torch front ends (tests/test_adam.py)."""
    plain = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True))
    onebit = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=True,
                                exchange=allgather_exchange, send="momentum", warmup=int8_mean))
    gradient = np.array(reference(5, 2, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=True,
                                  exchange=allgather_exchange, send="gradient", warmup=int8_mean))
    schedule = np.array(reference(24, None, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=True,
                                  exchange=allgather_exchange, warmup=int8_mean, clip=20.0, live=4))
    live = np.array(reference(12, 12, lr=0.01, b1=0.8, b2=0.95, wd=0.05, decoupled=True, warmup=int8_mean))
    units = np.array(reference(len(LRS), 2, lr=0.0, b1=0.8, b2=0.95, wd=0.05, decoupled=True,
                               exchange=allgather_exchange, send="gradient", warmup=int8_mean, lrs=LRS))
    for case, want, steps in (("none", plain, 6), ("onebit", onebit, 5), ("function", gradient, 5),
                              ("schedule", schedule, 24), ("small", live, 12), ("lr_units", units, len(LRS))):
        for r in range(WORLD):
            seen = runs[case][r]
            np.testing.assert_allclose(np.array(seen["weights"], dtype=np.float32), want, rtol=1e-5, atol=1e-6,
                                       err_msg=case)
            assert seen["iterations"] == steps
        assert runs[case][0]["weights"] == runs[case][1]["weights"]


@pytest.mark.horovod
def test_keras_clips_the_mean_in_v_steps_and_each_rank_by_its_coefficient_after(runs):
    """The clip of every front end (hvdcompress.step.driver), inside a tf.function: under FrozenAdam
    the v-steps clip the exchanged mean and keep its coefficient, the compressed steps scale each
    rank's gradient by it; each rank clipped to c in every step (the rule before) differs."""
    want = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True, clip=5.0))
    each = np.array(reference(6, 3, lr=0.01, b1=0.9, b2=0.99, wd=0.1, decoupled=True, clip=5.0, clip_each=True))
    assert np.abs(want - each).max() > 1e-4   # the rules differ
    for r in range(WORLD):
        np.testing.assert_allclose(np.array(runs["clip"][r]["weights"], dtype=np.float32), want,
                                   rtol=1e-5, atol=1e-6)


def test_keras_take_over_needs_adam_and_refuses_amsgrad():
    frozen = hc.FrozenAdam(hc.OneBit())
    with pytest.raises(ValueError, match="allowed: a Keras Adam or AdamW"):
        hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=frozen)
    with pytest.raises(ValueError, match="amsgrad=True"):
        hvck.DistributedOptimizer(tf.keras.optimizers.Adam(amsgrad=True), compression=frozen)
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match="not on the tape"):
        hvc.DistributedGradientTape(tape, compression=frozen)
