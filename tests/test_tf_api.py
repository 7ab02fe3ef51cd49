"""Argument checking and wrapping of the TF and Keras entry points (one process, no collectives).

Every error must name the parameter, the value and what is allowed.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import pytest
import tensorflow as tf

import hvdcompress
import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck


def tape() -> tf.GradientTape:
    with tf.GradientTape() as t:
        pass
    return t


@pytest.mark.parametrize("kwargs,message", [
    ({"op": hvd.Adasum}, r"op=.*allowed: hvd.Average or hvd.Sum"),
    ({"gradient_predivide_factor": 0.0}, r"gradient_predivide_factor=0.0: allowed: a number > 0"),
    ({"gradient_predivide_factor": 2.0, "op": hvd.Sum},
     r"gradient_predivide_factor=2.0 needs op=hvd.Average"),
    ({"groups": "all"}, r"groups='all': allowed: None, a positive integer, or a list of lists"),
    ({"sparse_as_dense": "yes"}, r"sparse_as_dense='yes': allowed: True or False"),
    ({"device_dense": 0}, r"device_dense=0: allowed: a device string"),
    ({"clip_grad_norm": -1.0}, r"clip_grad_norm=-1.0: allowed: None or a finite number > 0"),
    ({"clip_grad_norm": 1.0, "compression": hvdcompress.DGC(0.99, clip_norm=2.0)},
     r"clip_grad_norm=1.0 and the compressor's clip_norm=2.0 both clip"),
    ({"compression": {"compressor": "onebit", "ef": "vanilla", "adam": "frozen"}},
     r"the Adam take-over \(FrozenAdam\) replaces the optimizer's step"),
    ({"check_replicas": -1}, r"check_replicas=-1: allowed"),
    ({"scale_local_gradients": 1}, r"scale_local_gradients=1: allowed: True or False"),
])
def test_tape_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hvc.DistributedGradientTape(tape(), **kwargs)


def test_compression_must_be_a_compressor_or_a_dict():
    with pytest.raises(TypeError, match=r"compression='dgc' is not supported; allowed: an "
                                        r"hvdcompress Compressor"):
        hvc.DistributedGradientTape(tape(), compression="dgc")
    with pytest.raises(ValueError, match=r"compressor='nope' is unknown; allowed:"):
        hvc.DistributedGradientTape(tape(), compression={"compressor": "nope"})
    wrapped = hvc.DistributedGradientTape(tape(), compression={"compressor": "topk", "k": "0.1"})
    assert isinstance(wrapped, tf.GradientTape)
    assert isinstance(wrapped.exchange.compressor, hvdcompress.TopK)


def test_keras_optimizer_rejects_bad_arguments():
    with pytest.raises(TypeError, match=r"optimizer=.*allowed: a Keras optimizer"):
        hvck.DistributedOptimizer(object())
    with pytest.raises(ValueError, match=r"backward_passes_per_step=0: allowed: an integer >= 1"):
        hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match=r"SGD momentum=0.9 and the compressor's momentum=0.8: "
                                         r"momentum would be applied twice"):
        hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                  compression=hvdcompress.DGC(0.99, momentum=0.8))


def test_sgd_momentum_is_taken_over_by_dgc_only():
    sgd = tf.keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    opt = hvck.DistributedOptimizer(sgd, compression=hvdcompress.DGC(0.99))
    assert isinstance(opt, tf.keras.optimizers.SGD)
    assert opt.momentum == 0.0 and not opt.nesterov
    assert (opt._hvdc_exchange.momentum, opt._hvdc_exchange.nesterov) == (0.9, True)
    kept = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                     compression=hvdcompress.FP16())
    assert kept.momentum == 0.9 and kept._hvdc_exchange.momentum == 0.0
    adam = hvck.DistributedOptimizer(tf.keras.optimizers.Adam(0.1), compression=hvdcompress.DGC(0.99))
    assert isinstance(adam, tf.keras.optimizers.Adam) and adam._hvdc_exchange.momentum == 0.0


def test_warmup_callback_rejects_what_it_cannot_ramp():
    with pytest.raises(ValueError, match=r"has no sparsity warm-up; allowed: DGC"):
        hvck.callbacks.SparsityWarmupCallback(hvdcompress.TopK(0.1), hvdcompress.ExponentialWarmup(3))
    with pytest.raises(ValueError, match=r"schedule='exp' is not a schedule; allowed: None, "
                                         r"ExponentialWarmup"):
        hvck.callbacks.SparsityWarmupCallback(hvdcompress.DGC(0.99), "exp")
    with pytest.raises(ValueError, match=r"schedule=None and the compressor has no warmup"):
        hvck.callbacks.SparsityWarmupCallback(hvdcompress.DGC(0.99))
    with pytest.raises(TypeError, match=r"is neither an hvdcompress compressor nor an optimizer"):
        hvck.callbacks.SparsityWarmupCallback(tf.keras.optimizers.SGD(0.1))


def test_warmup_callback_installs_the_schedule_and_logs_sparsity():
    dgc = hvdcompress.DGC(0.999)
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=dgc)
    callback = hvck.callbacks.SparsityWarmupCallback(opt, hvdcompress.ExponentialWarmup(3))
    logs = {}
    for epoch in range(4):
        callback.on_epoch_begin(epoch)
        callback.on_epoch_end(epoch, logs)
        assert logs["sparsity"] == pytest.approx(1 - 0.001 ** ((epoch + 1) / 3) if epoch < 3 else 0.999)
    assert dgc.state_dict()["epoch"] == 3


@pytest.mark.parametrize("clip", [{"clipnorm": 1.0}, {"global_clipnorm": 1.0}, {"clipvalue": 0.5}])
def test_keras_clipping_with_a_stateful_compressor_warns(clip):
    """Keras clips after the exchange: with DGC (momentum) or error feedback that clips the
    exchanged update, so the wrapper warns and names clip_grad_norm."""
    for compression in (hvdcompress.DGC(0.99), hvdcompress.ErrorFeedback(hvdcompress.TopK(5))):
        with pytest.warns(UserWarning, match=r"pass clip_grad_norm=\.\.\. to"):
            hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, **clip), compression=compression)


def test_keras_clipping_with_a_stateful_intra_node_compressor_warns():
    """Two-level: a stateless compressor between nodes, error feedback inside them (checked on
    the wrapper's warning alone: building the two-level exchange needs Horovod's process sets)."""
    from hvdcompress.tensorflow.keras.settings import warn_keras_clipping
    ef = hvdcompress.ErrorFeedback(hvdcompress.OneBit())
    with pytest.warns(UserWarning, match=r"with onebit, which keeps an error-feedback residual"):
        warn_keras_clipping(hvdcompress.FP16(), ef, {"clipnorm": 1.0})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_keras_clipping(hvdcompress.FP16(), hvdcompress.FP16(), {"clipnorm": 1.0})
        warn_keras_clipping(hvdcompress.FP16(), ef, {"clipnorm": None})


def test_keras_clipping_without_state_or_with_clip_grad_norm_does_not_warn():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, clipnorm=1.0),
                                  compression=hvdcompress.FP16())
        hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=hvdcompress.DGC(0.99),
                                  clip_grad_norm=1.0)


def test_gradient_accumulator_restarts_from_zeros_after_a_step():
    """backward_passes_per_step: an inf of one aggregation cycle does not reach the next
    (Horovod's test_grad_aggregation_with_inf_grad)."""
    import numpy as np

    from hvdcompress.tensorflow.keras.accumulate import GradientAccumulator
    acc = GradientAccumulator(2, average=True)
    assert not bool(acc.add([tf.constant([np.inf, 1.0])]))
    assert bool(acc.add([tf.constant([1.0, 1.0])]))
    first = acc.take()[0].numpy()
    assert np.isinf(first[0]) and first[1] == 1.0
    acc.add([tf.constant([2.0, 2.0])])
    assert bool(acc.add([tf.constant([4.0, 0.0])]))
    np.testing.assert_array_equal(acc.take()[0].numpy(), [3.0, 1.0])
