"""Train an MLP on scikit-learn's digits with a custom TensorFlow loop, Horovod and
hvdcompress's DistributedGradientTape: dense first, then DGC, and print both accuracies.

    horovodrun -np 2 -H localhost:2 --gloo python examples/tensorflow2_train.py

The data ships inside scikit-learn (no download). Each rank trains on its own shard. DGC applies
the momentum itself (the tape has no optimizer to take it from), so it runs with a plain SGD;
dense runs with SGD(momentum=0.9). Rank 0 prints one ``RESULT {json}`` line per run (test
accuracy, mean step time, gradient bytes of one step after warm-up: dense vs sent by this rank)
and a comparison at the end.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from compression_cli import add_intra_node_arguments, init_horovod, intra_node_from_args  # examples/
from hvdrun import compression_figures, figures_text  # examples/
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdcompress
import hvdcompress.tensorflow as hvc
from hvdcompress.registry import parse_params


def load_data(rank: int, size: int) -> tuple:
    """This rank's shard of the training split, and the whole test split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                              stratify=digits.target)
    return x_tr[rank::size], y_tr[rank::size].astype(np.int64), x_te, y_te.astype(np.int64)


def build_model(hidden: int, seed: int) -> tf.keras.Model:
    """64 -> hidden -> hidden -> 10; the hidden weights are large enough for DGC to sparsify."""
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(hidden, activation="relu"),
        tf.keras.layers.Dense(10)])


def accuracy(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model(x, training=False).numpy(), 1) == y))


def dgc_params(args: argparse.Namespace) -> dict:
    """The DGC run's dict for hvdcompress.from_params: ``--params`` if given, else DGC with
    ``--sparsity`` and ``--warmup-epochs`` (the DGC paper's ramp over that many epochs)."""
    if args.params:
        return parse_params(args.params)
    return {"compressor": "dgc", "sparsity": args.sparsity, "warmup_epochs": args.warmup_epochs}


def two_level(args: argparse.Namespace, use_dgc: bool) -> dict:
    """The compressed run's ``intra_node`` / ``ranks_per_node`` from ``--intra-node`` (the dense
    run stays flat, as Horovod's)."""
    if not use_dgc or args.intra_node is None:
        return {}
    return {"intra_node": intra_node_from_args(args), "ranks_per_node": args.ranks_per_node}


def train(args: argparse.Namespace, use_dgc: bool) -> dict:
    x_tr, y_tr, x_te, y_te = load_data(hvd.rank(), hvd.size())
    model = build_model(args.hidden, args.seed)
    hvc.broadcast_variables(model.variables, root_rank=0)
    if use_dgc:
        compression = hvdcompress.from_params({"momentum": "plain", "momentum_mu": 0.9,
                                               **dgc_params(args)})
        opt = tf.keras.optimizers.SGD(args.lr)
    else:
        compression, opt = None, tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tapes = []

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvc.DistributedGradientTape(tape, compression=compression, **two_level(args, use_dgc))
        tapes.append(tape)  # at trace time: to read its byte counts afterwards
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(args.seed + hvd.rank())
    steps = len(x_tr) // args.batch_size
    times = []
    for epoch in range(args.epochs):
        if use_dgc:
            compression.set_epoch(epoch)
        order = rng.permutation(len(x_tr))
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            start = time.perf_counter()
            loss = step(tf.constant(x_tr[idx]), tf.constant(y_tr[idx]))
            times.append(time.perf_counter() - start)
        if hvd.rank() == 0 and (epoch + 1) % 5 == 0:
            sparsity = compression.current_sparsity if use_dgc else None
            figures = compression_figures(tapes[-1].total_bytes, sparsity) if tapes else {}
            print(f"[{'dgc' if use_dgc else 'dense'}] epoch {epoch + 1}: loss {float(loss):.4f}"
                  f"{figures_text(figures)}", flush=True)
    last = tapes[-1].last_step_bytes
    return {"compression": "dgc" if use_dgc else "dense", "rank": hvd.rank(),
            "accuracy": accuracy(model, x_te, y_te),
            "step_ms": 1000 * float(np.mean(times[steps:])),
            "dense_bytes": last.dense, "sent_bytes": last.sent}


def compare(train: Callable[[argparse.Namespace, bool], dict], description: str) -> None:
    """Parse the arguments, train dense then DGC with ``train(args, use_dgc)``, print both."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sparsity", type=float, default=0.999)
    parser.add_argument("--warmup-epochs", type=int, default=4)
    parser.add_argument("--params", default=None,
                        help="key=value,... for hvdcompress.from_params: the DGC run's compressor "
                             "(overrides --sparsity and --warmup-epochs), e.g. compressor=dgc,"
                             "sparsity=0.99,warmup_sparsities=0.75,0.9375,0.984375")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    add_intra_node_arguments(parser)
    args = parser.parse_args()
    init_horovod(hvd, args)
    results = [train(args, use_dgc) for use_dgc in (False, True)]
    if hvd.rank() == 0:
        for r in results:
            print("RESULT " + json.dumps(r), flush=True)
        dense, dgc = results
        print(f"test accuracy: dense {dense['accuracy']:.4f}, DGC {dgc['accuracy']:.4f} "
              f"({args.params or f'sparsity {args.sparsity}'}; bytes per step "
              f"{dgc['sent_bytes']} vs {dgc['dense_bytes']} dense)", flush=True)


if __name__ == "__main__":
    compare(train, __doc__)
