"""Compressor state across a checkpoint, and tracing of a tf.function step; both cases in one
launch (``--dir``: where the checkpoint goes), reported with case=:

checkpoint: train 3 steps (Keras DistributedOptimizer, SGD momentum taken over by DGC),
  save a tf.train.Checkpoint, train 2 more; then rebuild everything fresh, restore, train the
  same 2 steps. Prints both final weights and the saved / restored compressor state.
retrace: a tf.function step with the tape; between calls change the DGC sparsity, the
  warm-up epoch and the learning rate. Prints the number of traces and the bytes sent per call.
"""
import argparse
import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck
from hvdcompress import DGC, ExponentialWarmup


def batch(rank: int, step: int):
    rng = np.random.default_rng([rank, step])
    return (tf.constant(rng.standard_normal((16, 32)).astype(np.float32)),
            tf.constant(rng.standard_normal((16, 32)).astype(np.float32)))


def build():
    """A fresh model, DGC and optimizer. Model and layer are named: DGC's sampling depends on
    tensor names, and Keras numbers unnamed models and layers anew in every build."""
    model = tf.keras.Sequential([tf.keras.Input((32,)),
                                 tf.keras.layers.Dense(32, kernel_initializer="ones", name="fc")],
                                name="net")
    dgc = DGC(0.9, min_numel=0)
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.01, momentum=0.9), compression=dgc)
    return model, dgc, opt


def trainer(model, opt):
    """A tf.function training step for this model and optimizer (one per pair: a tf.function
    creates variables on its first call only)."""
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return train_step


def snapshot(state) -> dict:
    return {f"{name}/{key}": float(np.sum(np.abs(var.numpy())))
            for name, ts in state.named().items() for key, var in ts.slots.items()}


def checkpoint(rank: int, directory: str) -> None:
    model, dgc, opt = build()
    train_step = trainer(model, opt)
    for step in range(3):
        train_step(*batch(rank, step))
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    path = ckpt.write(os.path.join(directory, f"rank{rank}", "ckpt"))
    saved = snapshot(opt._hvdc_compression_state)
    saved_counters = dgc.state_dict()
    for step in range(3, 5):
        train_step(*batch(rank, step))
    continued = model.get_weights()[0].ravel().tolist()

    model2, dgc2, opt2 = build()
    status = tf.train.Checkpoint(model=model2, optimizer=opt2).read(path)
    train_step = trainer(model2, opt2)
    for step in range(3, 5):
        train_step(*batch(rank, step))
    status.assert_consumed()  # every saved value, compressor state included, found its variable

    model3, _, opt3 = build()  # control: the model restored, the compressor state not
    tf.train.Checkpoint(model=model3).read(path).expect_partial()
    train_step = trainer(model3, opt3)
    for step in range(3, 5):
        train_step(*batch(rank, step))
    result(rank, case="checkpoint", saved=saved, saved_counters=saved_counters, restored_counters=dgc2.state_dict(),
           continued_counters=dgc.state_dict(), continued=continued,
           resumed=model2.get_weights()[0].ravel().tolist(),
           resumed_without_state=model3.get_weights()[0].ravel().tolist())


def retrace(rank: int) -> None:
    w = tf.Variable(tf.ones([4096]), name="w")
    dgc = DGC(0.5, momentum=0.9, min_numel=0, warmup=ExponentialWarmup(2))
    opt = tf.keras.optimizers.SGD(0.1)
    exchanges = []  # appended at trace time only: a first call that creates variables traces twice

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x)
        tape = hvc.DistributedGradientTape(tape, compression=dgc)
        exchanges.append(tape.exchange)
        opt.apply_gradients(zip([tape.gradient(loss, w)], [w]))

    x = tf.constant(np.random.default_rng(rank).standard_normal(4096).astype(np.float32))
    sent, sparsities, weights, traces = [], [], [], []
    for change in ("none", "epoch", "sparsity", "lr"):
        if change == "epoch":
            dgc.set_epoch(5)
        elif change == "sparsity":
            dgc.sparsity = 0.99
        elif change == "lr":
            opt.learning_rate.assign(0.0)
        sparsities.append(dgc.current_sparsity)
        step(x)
        traces.append(len(exchanges))
        sent.append(exchanges[-1].last_step_bytes.sent)
        weights.append(float(tf.reduce_sum(w)))
    result(rank, case="retrace", traces=traces, sparsities=sparsities, sent=sent, weights=weights,
           step=dgc.state_dict()["step"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    hvd.init()
    checkpoint(hvd.rank(), args.dir)
    retrace(hvd.rank())


if __name__ == "__main__":
    main()
