"""CSC through hvdcompress.tensorflow.DistributedGradientTape under real Horovod.

The same toy and config (argv[1], JSON) as torch_csc.py: a weight of ``n`` elements (two rounds)
and a bias of ``bias`` (dense) exchanged by the tape; the tape has no optimizer to take momentum
from, so CSC gets ``momentum`` / ``nesterov`` itself, and a plain SGD step ``w -= lr * g``
follows. Each rank reports its final parameters.
"""
import json
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress as hc
import hvdcompress.tensorflow as hvc


def rank_vector(rank: int, n: int, seed: int) -> np.ndarray:
    """The gradient rank ``rank`` produces (as tests/hvd/torch_common.py's, without torch)."""
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    hvd.init()
    w = tf.Variable(tf.zeros([cfg["n"]]), name="w")
    b = tf.Variable(tf.zeros([cfg["bias"]]), name="b")
    csc = hc.CSC(cfg["ratio"], cfg["chunk"], momentum=cfg["mu"], nesterov=cfg["nesterov"],
                 min_numel=cfg["min_numel"], warmup=hc.ExponentialWarmup(cfg["warmup"], unit="step"))
    for step in range(cfg["steps"]):
        c = tf.constant(rank_vector(hvd.rank(), cfg["n"], seed=100 + 10 * step))
        d = tf.constant(rank_vector(hvd.rank(), cfg["bias"], seed=500 + 10 * step))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c) + tf.reduce_sum(b * d)
        tape = hvc.DistributedGradientTape(tape, compression=csc)
        for var, grad in zip((w, b), tape.gradient(loss, [w, b])):
            var.assign_sub(cfg["lr"] * grad)
    result(hvd.rank(), w=w.numpy().tolist(), b=b.numpy().tolist())


main()
