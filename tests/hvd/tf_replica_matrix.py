"""The replica-identity matrix (TensorFlow): an MLP trained on every rank's own batches through
the tape (eager and tf.function) and Keras fit, reporting a digest of the variables after every
step; then the replica guard catching a one-bit difference (tape and Keras optimizer).

argv[1]: JSON {"cases": [{"spec", "api": "tape" | "function" | "fit", "clip", "optimizer":
"momentum" | "nesterov" | "adam"}], "steps": N}. Every case runs check_replicas=10."""
import hashlib
import json
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck
from hvdcompress.registry import as_compressor
from hvdcompress.step.replicas import ReplicaMismatch

hvd.init()
rank = hvd.rank()
cfg = json.loads(sys.argv[1])
BATCH = 16


def data(steps: int):
    rng = np.random.default_rng(1000 + rank)
    return (rng.standard_normal((steps * BATCH, 64)).astype(np.float32),
            rng.integers(0, 10, steps * BATCH).astype(np.int64))


def model_and_optimizer(kind: str):
    tf.keras.backend.clear_session()  # layer names restart: the guard test names dense_1/bias
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(300, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    if kind == "adam":
        return model, tf.keras.optimizers.Adam(1e-3)
    return model, tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=kind == "nesterov")


def digest(model) -> str:
    h = hashlib.sha256()
    for v in model.variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()[:16]


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def train(case: dict, steps: int, after=None) -> list:
    model, opt = model_and_optimizer(case["optimizer"])
    x, y = data(steps)
    digests = []
    if case["api"] == "fit":
        wrapped = hvck.DistributedOptimizer(opt, compression=case["spec"], clip_grad_norm=case["clip"],
                                            check_replicas=case.get("check", 10))
        model.compile(wrapped, LOSS, jit_compile=False)
        record = tf.keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: digests.append(digest(model)))
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record])
        return digests
    compressor = as_compressor(case["spec"])  # one compressor: its state lives across tapes

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb))
        tape = hvc.DistributedGradientTape(tape, compression=compressor, clip_grad_norm=case["clip"],
                                           check_replicas=case.get("check", 10))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    run = tf.function(step) if case["api"] == "function" else step
    for s in range(steps):
        run(tf.constant(x[s * BATCH:(s + 1) * BATCH]), tf.constant(y[s * BATCH:(s + 1) * BATCH]))
        digests.append(digest(model))
        if after is not None:
            after(s + 1, model)
    return digests


for case in cfg["cases"]:
    result(rank, case=case, digests=train(case, cfg["steps"]))


def flip_one_bit(step, model):
    """After step 3, rank 1's last bias gets mantissa bit 20 of element 3 flipped (an eighth of
    the value or more). The lowest bit could be absorbed: when the next update's result has a
    larger exponent than the bias, the two ranks' values can round to the same float (seen on
    an AVX-512 machine), and the guard would rightly see no difference."""
    if step == 3 and rank == 1:
        bias = model.variables[-1]
        bits = bias.numpy().view(np.int32).copy()
        bits[3] ^= 1 << 20
        bias.assign(bits.view(np.float32))


try:
    train({"spec": {"compressor": "int8"}, "api": "tape", "clip": None, "optimizer": "momentum",
           "check": 5}, 8, after=flip_one_bit)
    error = None
except ReplicaMismatch as e:
    error = str(e)
result(rank, case={"guard": "tape"}, error=error)
