"""Train a linear model y = x W on rank-specific data through the TF entry points; print every
rank's final weights, one RESULT per run of the JSON list given.

api "tape":      hvc.DistributedGradientTape + a Keras SGD (custom loop)
api "optimizer": hvck.DistributedOptimizer.apply_gradients (custom loop)
api "fit":       model.fit with hvck.DistributedOptimizer and our broadcast callback
Loss: mean over the batch of 0.5 * ||x W - y||^2, so the local gradient is X^T (X W - Y) / B.
"""
import argparse
import json

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck
from hvdcompress import from_params

IN, OUT, BATCH = 64, 16, 32


def data(rank: int):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    y = rng.standard_normal((BATCH, OUT)).astype(np.float32)
    return x, y


def loss_fn(y, pred):
    return 0.5 * tf.reduce_sum(tf.square(pred - y), axis=-1)


def train(rank: int, api: str, compression: dict, momentum: float = 0.0, nesterov: bool = False,
          lr: float = 0.1, steps: int = 5, function: bool = False, init: str = "zeros",
          passes: int = 1) -> list:
    """One training run; returns this rank's final weights. ``passes``: the optimizer's
    backward_passes_per_step; every step then runs that many passes on the same batch."""
    compressor = from_params(compression)
    initializer = "zeros" if init == "zeros" else tf.keras.initializers.RandomNormal(seed=rank)
    model = tf.keras.Sequential([tf.keras.Input((IN,)), tf.keras.layers.Dense(
        OUT, use_bias=False, kernel_initializer=initializer)])
    sgd = tf.keras.optimizers.SGD(lr, momentum=momentum, nesterov=nesterov)
    x, y = data(rank)
    if api == "fit":
        opt = hvck.DistributedOptimizer(sgd, compression=compressor)
        model.compile(opt, loss_fn, jit_compile=False)
        model.fit(x, y, batch_size=BATCH, epochs=steps, shuffle=False, verbose=0,
                  callbacks=[hvck.callbacks.BroadcastGlobalVariablesCallback(0)])
        return model.get_weights()[0].ravel().tolist()
    if init == "random":
        hvc.broadcast_variables(model.variables, root_rank=0)
    opt = sgd if api == "tape" else hvck.DistributedOptimizer(
        sgd, compression=compressor, backward_passes_per_step=passes)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(yb, model(xb)))
        if api == "tape":
            tape = hvc.DistributedGradientTape(tape, compression=compressor)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    run = tf.function(step) if function else step
    for _ in range(steps * passes):
        run(tf.constant(x), tf.constant(y))
    return model.get_weights()[0].ravel().tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", help="JSON list of keyword arguments of train()")
    args = ap.parse_args()
    hvd.init()
    for i, run in enumerate(json.loads(args.runs)):
        result(hvd.rank(), run=i, weights=train(hvd.rank(), **run))


if __name__ == "__main__":
    main()
