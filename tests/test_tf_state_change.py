"""Issue 24 on TensorFlow / Keras: state under change.

1. Loss scaling (tests/tf_state/amp.py, 2 ranks): the tape's ``scaler=`` gives the weights of
   the run without a loss scale; an overflow on one rank leaves every rank's compressor state
   as it was (tape, and the Keras optimizer around a LossScaleOptimizer), the scale is lowered
   on every rank, and the run continues as if that step's batches had not been there.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from conftest import run_horovod

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
def amp():
    records = run_horovod(WORKERS / "amp.py", np=2, timeout=300)
    by_case: dict = {}
    for r in records:
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
