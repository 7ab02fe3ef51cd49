"""Rank r's gradient of w is c_r (loss = sum(w * c_r)); print what the tape returns.

--case topk:   TopK(k) through allgather of (values, indices); op given by --op
--case slices: an embedding lookup's IndexedSlices gradient, passed through uncompressed
"""
import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import hvdcompress.tensorflow as hvc
from common import result
from hvdcompress import TopK


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["topk", "slices"], required=True)
    ap.add_argument("--numel", type=int, default=1000)
    ap.add_argument("--topk", type=int, default=50)
    ap.add_argument("--op", choices=["average", "sum"], default="average")
    args = ap.parse_args()
    hvd.init()
    rank = hvd.rank()
    op = hvd.Average if args.op == "average" else hvd.Sum
    if args.case == "topk":
        c = np.random.default_rng(10 + rank).standard_normal(args.numel).astype(np.float32)
        w = tf.Variable(tf.zeros([args.numel]), name="w")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        tape = hvc.DistributedGradientTape(tape, compression=TopK(args.topk), op=op)
        grad = tape.gradient(loss, w)
        result(rank, grad=grad.numpy().tolist(), bytes=tape.exchange.last_step_bytes.as_dict())
    else:
        table = tf.Variable(tf.zeros([10, 4]), name="table")
        ids = tf.constant([rank, 3, 3])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * float(rank + 1))
        tape = hvc.DistributedGradientTape(tape, op=op)
        grad = tape.gradient(loss, table)
        result(rank, is_slices=isinstance(grad, tf.IndexedSlices),
               grad=tf.convert_to_tensor(grad).numpy().tolist())


if __name__ == "__main__":
    main()
