"""Keras's LossScaleOptimizer inside hvdcompress.tensorflow.keras.DistributedOptimizer under
2 ranks (tests/test_tf_state_change.py, docs/mixed_precision.md): ``model.fit`` of a 16-32-4 float32 MLP,
30 steps on each rank's own batches, the loss scale starting at 2^10 and doubling every 3
steps. For each compressor that carries state: the weights with the LossScaleOptimizer
(``DistributedOptimizer(LossScaleOptimizer(SGD))``) and without it (``DistributedOptimizer(SGD)``);
Keras unscales the gradients before ``apply_gradients``, where they are compressed, so the two
must be equal (powers of two scale exactly). Each record: the gap |w_lso - w_plain| /
|w_plain - w_0|, a checksum of the weights (ranks compared by the test), the final scale."""
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hvdrun

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
import hvdcompress.tensorflow.keras as hvck  # noqa: E402

hvd.init()
rank = hvd.rank()
STEPS, BATCH = 30, 8


def fit(compression, loss_scale: bool) -> tuple:
    tf.keras.backend.clear_session()   # the same layer names in every run (PowerSGD seeds by name)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                                 tf.keras.layers.Dense(4)])
    start = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    opt = tf.keras.optimizers.SGD(0.05)
    if loss_scale:
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt, initial_scale=2.0 ** 10, dynamic_growth_steps=3)
    opt = hvck.DistributedOptimizer(opt, compression=compression)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    data = np.random.default_rng(100 + rank)
    x = data.standard_normal((STEPS * BATCH, 16)).astype(np.float32)
    y = data.standard_normal((STEPS * BATCH, 4)).astype(np.float32)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    return weights, start, float(opt.loss_scale) if loss_scale else None


for name, make in (("topk_ef", lambda: hc.ErrorFeedback(hc.TopK(0.1))), ("powersgd", lambda: hc.PowerSGD(2)),
                   ("onebit_ef", lambda: hc.ErrorFeedback(hc.OneBit()))):
    plain, start, _ = fit(make(), False)
    scaled, _, scale = fit(make(), True)
    write_result(rank, {"case": f"keras_lso_{name}",
                        "gap": float(np.linalg.norm(scaled - plain) / np.linalg.norm(plain - start)),
                        "checksum": hashlib.sha256(scaled.tobytes()).hexdigest()[:16], "scale": scale})
