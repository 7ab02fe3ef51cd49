"""model.fit with DGC and SparsityWarmupCallback; print the per-epoch logs.

Runs, each 5 epochs, reported with case=:
exp:  ExponentialWarmup(3) over epochs, target 0.999
list: ListWarmup([0.5, 0.75, 0.9], begin=2, length=3, unit="step"), 2 steps/epoch
On Keras 2, Horovod's own BroadcastGlobalVariablesCallback and MetricAverageCallback run beside it.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow.keras as hvck
from hvdcompress import DGC, ExponentialWarmup, ListWarmup

KERAS2 = int(tf.keras.__version__.split(".")[0]) < 3 if hasattr(tf.keras, "__version__") else True


def run(rank: int, schedule_name: str, epochs: int = 5) -> None:
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.standard_normal((32, 64)).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, use_bias=False)])
    dgc = DGC(0.999, min_numel=0)
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9), compression=dgc)
    model.compile(opt, "mse", jit_compile=False)
    if schedule_name == "exp":
        schedule = ExponentialWarmup(3)
    else:
        schedule = ListWarmup([0.5, 0.75, 0.9], begin=2, length=3, unit="step")
    sent = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logs.update(sent=opt.last_step_bytes.sent))
    callbacks = [hvck.callbacks.SparsityWarmupCallback(opt, schedule), sent]
    if KERAS2:
        import horovod.tensorflow.keras as hvdk
        callbacks += [hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                      hvdk.callbacks.MetricAverageCallback()]
    else:
        callbacks.append(hvck.callbacks.BroadcastGlobalVariablesCallback(0))
    history = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=callbacks)
    result(rank, case=schedule_name, sparsity=[float(s) for s in history.history["sparsity"]],
           sent=[int(s) for s in history.history["sent"]],
           dense=opt.last_step_bytes.dense, keras2=KERAS2,
           weights=float(np.sum(model.get_weights()[0])))


if __name__ == "__main__":
    hvd.init()
    for name in ("exp", "list"):
        run(hvd.rank(), name)
