"""Training step time of the TensorFlow examples, per compressor: the custom loop of
examples/tensorflow2_train.py (DistributedGradientTape) or the ``model.fit`` of
examples/keras_train.py (Keras DistributedOptimizer), with the same data, model and batch.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/tf_step_time.py \\
        --run tape compressor=onebit,ef=vanilla --run keras compressor=int8

Self-contained on purpose: it uses only what every version of hvdcompress has
(``from_params``, the tape, the Keras optimizer), so the same script times an older checkout
(``PYTHONPATH=<checkout>``) against this one. A step is one ``tf.function`` call of the custom
loop (forward, backward, compression, exchange, apply), or one batch of ``fit``
(``on_train_batch_begin`` to ``on_train_batch_end``). The first epoch (tracing, warm-up) is not
counted. Each ``--run API PARAMS`` runs in turn in the same processes (one TensorFlow start-up);
rank 0 prints one ``RESULT {json}`` per run with the mean and median step in milliseconds.
"""
from __future__ import annotations

import argparse
import json
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdcompress
import hvdcompress.tensorflow as hvc
import hvdcompress.tensorflow.keras as hvck


def load_shard(rank: int, size: int) -> tuple:
    """This rank's shard of the examples' training split (scikit-learn's digits)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, _, y_tr, _ = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                        stratify=digits.target)
    return x_tr[rank::size], y_tr[rank::size].astype(np.int64)


def build_model(hidden: int, seed: int) -> tf.keras.Model:
    """The examples' MLP: 64 -> hidden -> hidden -> 10."""
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(10)])


def parse(text: str) -> dict:
    """``"k=v,k=v"`` as a dict of strings for ``hvdcompress.from_params``."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--params={text!r}: allowed: key=value pairs separated by commas")
    return dict(pairs)


def tape_steps(args: argparse.Namespace, params: str, x: np.ndarray, y: np.ndarray) -> list:
    """Seconds per step of the tape loop (tensorflow2_train.py's, with its Momentum decorator
    and plain SGD)."""
    model = build_model(args.hidden, args.seed)
    hvc.broadcast_variables(model.variables, root_rank=0)
    compression = hvdcompress.from_params({"momentum": "plain", "momentum_mu": "0.9",
                                           **parse(params)})
    opt = tf.keras.optimizers.SGD(args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvc.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(args.seed + hvd.rank())
    per_epoch = len(x) // args.batch_size
    times = []
    for _ in range(args.epochs):
        order = rng.permutation(len(x))
        for i in range(per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            xb, yb = tf.constant(x[idx]), tf.constant(y[idx])
            start = time.perf_counter()
            step(xb, yb).numpy()
            times.append(time.perf_counter() - start)
    return times[per_epoch:]


class BatchTimer(tf.keras.callbacks.Callback):
    """Seconds from the start to the end of every training batch."""

    def __init__(self):
        super().__init__()
        self.times, self._start = [], 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def keras_steps(args: argparse.Namespace, params: str, x: np.ndarray, y: np.ndarray) -> list:
    """Seconds per batch of keras_train.py's ``fit`` (SGD with momentum 0.9, which DGC takes
    over)."""
    model = build_model(args.hidden, args.seed)
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr, momentum=0.9),
                                    compression=hvdcompress.from_params(parse(params)))
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    timer = BatchTimer()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=[hvck.callbacks.BroadcastGlobalVariablesCallback(0), timer])
    per_epoch = -(-len(x) // args.batch_size)
    return timer.times[per_epoch:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, action="append", required=True, metavar=("API", "PARAMS"),
                        help="tape|keras and key=value,... for from_params; repeatable")
    parser.add_argument("--label", default="", help="copied into the RESULT line")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs={args.epochs}: allowed: >= 2 (the first epoch is not timed)")
    for api, _ in args.run:
        if api not in ("tape", "keras"):
            parser.error(f"--run {api} ...: allowed APIs: tape, keras")
    hvd.init()
    x, y = load_shard(hvd.rank(), hvd.size())
    for api, params in args.run:
        times = (tape_steps if api == "tape" else keras_steps)(args, params, x, y)
        if hvd.rank() == 0:
            ms = 1000 * np.asarray(times)
            print("RESULT " + json.dumps({"label": args.label, "api": api, "params": params,
                                          "ranks": hvd.size(), "steps": len(ms),
                                          "mean_ms": float(ms.mean()),
                                          "median_ms": float(np.median(ms))}), flush=True)


if __name__ == "__main__":
    main()
