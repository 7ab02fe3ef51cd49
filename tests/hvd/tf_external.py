"""tests/test_external_compressor.py on the TF tape (horovodrun -np 2 --gloo):
tests/external_compressor.py's HalfTopK (the same class the torch runs use, here on TensorFlow
tensors), built by name with from_params, through hvdcompress.tensorflow.DistributedGradientTape.

* "exact:eager" / "exact:function": w = 0, loss = sum(w * c_r) (grad = c_r, the numpy draw of
  tests/hvd/torch_common.rank_vector), SGD lr=1, one step: the exchanged gradient and w;
* "ef": the same with error feedback, eager, 3 steps of c_{r,s} (seed 200 + 10 s): w after each;
* "train": a 2-layer Keras model (16 -> 32 -> 4), top-k + EF, 30 steps inside a tf.function on a
  fixed batch per rank (the weights broadcast from rank 0 first): the losses and the final
  weights' sha256.
"""
import hashlib
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the external compressor
import external_compressor  # noqa: E402,F401  registers "halftopk"

import hvdcompress  # noqa: E402
import hvdcompress.tensorflow as hvt  # noqa: E402

N = 1000
hvd.init()
rank = hvd.rank()


def rank_vector(r: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + r).standard_normal(n).astype(np.float32)


def linear_run(spec: dict, seeds: list, function: bool) -> tuple:
    compressor = hvdcompress.from_params(spec)
    w = tf.Variable(tf.zeros([N]), name="w")
    sgd = tf.keras.optimizers.SGD(1.0)

    def step(c):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        grads = hvt.DistributedGradientTape(tape, compression=compressor).gradient(loss, [w])
        sgd.apply_gradients(zip(grads, [w]))
        return grads[0]

    run = tf.function(step) if function else step
    ws, grads = [], []
    for seed in seeds:
        grads.append(run(tf.constant(rank_vector(rank, N, seed))).numpy().tolist())
        ws.append(w.numpy().tolist())
    return ws, grads


for function in (False, True):
    ws, grads = linear_run({"compressor": "halftopk", "k": "0.05"}, [100], function)
    result(rank, case=f"exact:{'function' if function else 'eager'}", w=ws[0], grad=grads[0])

ws, _ = linear_run({"compressor": "halftopk", "k": "0.05", "ef": "vanilla"}, [200 + 10 * s for s in range(3)], False)
result(rank, case="ef", ws=ws)

tf.keras.utils.set_random_seed(rank)   # different initial weights: the broadcast must make them equal
model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(4)])
hvt.broadcast_variables(model.variables, root_rank=0)
compressor = hvdcompress.from_params({"compressor": "halftopk", "k": "0.05", "ef": "vanilla"})
sgd = tf.keras.optimizers.SGD(0.1, momentum=0.9)
rng = np.random.default_rng(rank)
x = rng.standard_normal((32, 16)).astype(np.float32)
y = (x[:, :4] * 3).argmax(1)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(yb, model(xb), from_logits=True))
    tape = hvt.DistributedGradientTape(tape, compression=compressor)
    grads = tape.gradient(loss, model.trainable_variables)
    sgd.apply_gradients(zip(grads, model.trainable_variables))
    return loss


losses = [float(train_step(tf.constant(x), tf.constant(y))) for _ in range(30)]
weights = b"".join(v.numpy().tobytes() for v in model.trainable_variables)
result(rank, case="train", losses=losses, params=hashlib.sha256(weights).hexdigest())
