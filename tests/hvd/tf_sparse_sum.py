"""Rank r's gradient of w is c_r (loss = sum(w * c_r)); report what the tape returns. Cases:

topk.average, topk.sum: TopK(50) of 1000 through allgather of (values, indices), op Average / Sum
slices:                 an embedding lookup's IndexedSlices gradient, passed through uncompressed
"""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow as hvc
from hvdcompress import TopK

NUMEL, K = 1000, 50


def main() -> None:
    hvd.init()
    rank = hvd.rank()
    for op_name in ("average", "sum"):
        op = hvd.Average if op_name == "average" else hvd.Sum
        c = np.random.default_rng(10 + rank).standard_normal(NUMEL).astype(np.float32)
        w = tf.Variable(tf.zeros([NUMEL]), name="w")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        tape = hvc.DistributedGradientTape(tape, compression=TopK(K), op=op)
        grad = tape.gradient(loss, w)
        result(rank, case=f"topk.{op_name}", grad=grad.numpy().tolist(),
               bytes=tape.last_step_bytes.as_dict())
    table = tf.Variable(tf.zeros([10, 4]), name="table")
    ids = tf.constant([rank, 3, 3])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * float(rank + 1))
    tape = hvc.DistributedGradientTape(tape)
    grad = tape.gradient(loss, table)
    result(rank, case="slices", is_slices=isinstance(grad, tf.IndexedSlices),
           grad=tf.convert_to_tensor(grad).numpy().tolist())


if __name__ == "__main__":
    main()
