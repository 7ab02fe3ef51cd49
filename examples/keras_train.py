"""Train an MLP on scikit-learn's digits with Keras ``model.fit``, Horovod and hvdcompress:
dense first, then DGC with a sparsity warm-up callback, and print both accuracies.

    horovodrun -np 2 -H localhost:2 --gloo python examples/keras_train.py

Runs on Keras 2 (TF 2.15) and Keras 3 (TF >= 2.16): the broadcast callback is hvdcompress's own
(Horovod's works on Keras 2 only), and ``jit_compile=False`` because Keras 3 would compile the
step with XLA, which cannot run Horovod's or hvdcompress's ops. The SGD's momentum is taken over
by DGC (see hvdcompress.tensorflow.keras.optimizer). Rank 0 prints one ``RESULT {json}`` line per
run (with the per-epoch sparsity from the logs) and a comparison at the end.
"""
from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import tensorflow as tf
from tensorflow2_train import build_model, compare, dgc_params, load_data, two_level

import hvdcompress
import hvdcompress.tensorflow.keras as hvck


def train(args: argparse.Namespace, use_dgc: bool) -> dict:
    x_tr, y_tr, x_te, y_te = load_data(hvd.rank(), hvd.size())
    model = build_model(args.hidden, args.seed)
    compression = hvdcompress.from_params(dgc_params(args)) if use_dgc else None
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr, momentum=0.9),
                                    compression=compression, **two_level(args, use_dgc))
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    callbacks = [hvck.callbacks.BroadcastGlobalVariablesCallback(0)]
    if use_dgc:
        callbacks.append(hvck.callbacks.SparsityWarmupCallback(opt))  # the DGC's own warm-up
    history = model.fit(x_tr, y_tr, batch_size=args.batch_size, epochs=args.epochs,
                        callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    _, test_accuracy = model.evaluate(x_te, y_te, verbose=0)
    last = opt.last_step_bytes
    return {"compression": "dgc" if use_dgc else "dense", "rank": hvd.rank(),
            "accuracy": float(test_accuracy), "sparsity": history.history.get("sparsity"),
            "dense_bytes": last.dense, "sent_bytes": last.sent}


if __name__ == "__main__":
    compare(train, __doc__)
