"""The TF tape under 2 ranks: clip_grad_norm (local clip to c * sqrt(N) before compression with
top-k + EF, the exchanged average clipped to c with none) and
a rank outside the process set (its own gradients, no collective). Gradients are exact:
loss = sum(a * ca) + sum(b * cb). tests/test_tf_horovod.py recomputes the results in numpy."""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress as hc
import hvdcompress.tensorflow as hvc

only0 = hvd.ProcessSet([0])
hvd.init(process_sets=[only0])
rank = hvd.rank()


def vectors(seed: int):
    rng = np.random.default_rng(seed + rank)
    return (tf.constant(rng.standard_normal(60).astype(np.float32)),
            tf.constant(rng.standard_normal(40).astype(np.float32)))


def grads(compression, **kw):
    a, b = tf.Variable(tf.zeros(60)), tf.Variable(tf.zeros(40))
    ca, cb = vectors(1000)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a * ca) + tf.reduce_sum(b * cb)
    tape = hvc.DistributedGradientTape(tape, compression=compression, **kw)
    ga, gb = tape.gradient(loss, [a, b])
    return ga.numpy().tolist(), gb.numpy().tolist()


for label, comp in (("none", hc.NoCompression()), ("topk_ef", hc.ErrorFeedback(hc.TopK(10)))):
    ga, gb = grads(comp, clip_grad_norm=1.5)
    result(rank, case=f"tf_clip_{label}", a=ga, b=gb)
ga, gb = grads(hc.NoCompression(), process_set=only0)
result(rank, case="tf_outside_set", a=ga, b=gb)
total = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum, name="after").numpy()[0]
result(rank, case="tf_after", total=float(total))
