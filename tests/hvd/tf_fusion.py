"""fusion= on the TF tape (eager and inside a tf.function) and on the Keras optimizer, 2 ranks.

The tape exchanges tests/test_fusion.py's known gradients (``loss = sum(v * c)``) with
error-fed onebit over one bucket, for two steps; Keras fits a small model with a fused top-k +
error feedback. Each reports what it saw; tests/test_tf_horovod.py checks it against numpy.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result
from fusion_data import SIZES, grads

import hvdcompress as hc
import hvdcompress.tensorflow as hvt
import hvdcompress.tensorflow.keras as hvk

hvd.init()
rank = hvd.rank()

for mode in ("eager", "function"):
    variables = [tf.Variable(tf.zeros([k]), name=n) for n, k in SIZES.items()]
    compression = hc.ErrorFeedback(hc.OneBit())

    def exchange(cs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * c) for v, c in zip(variables, cs)])
        tape = hvt.DistributedGradientTape(tape, compression=compression, fusion=True)
        return tape.gradient(loss, variables), tape
    step_fn = exchange if mode == "eager" else tf.function(lambda cs: exchange(cs)[0])
    out = []
    for step in range(2):
        cs = [tf.constant(grads(rank, step)[n]) for n in SIZES]
        got = step_fn(cs)
        got = got[0] if mode == "eager" else got
        out.append({n: g.numpy().tolist() for n, g in zip(SIZES, got)})
    state = hvt.compression_state(compression)
    result(rank, case=f"tape_{mode}", grads=out, state=sorted(state.named()))

tf.keras.utils.set_random_seed(1)
net = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16), tf.keras.layers.Dense(2)])
topk = hc.ErrorFeedback(hc.TopK(0.1))
opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=topk, fusion=True, check_replicas=1)
net.compile(optimizer=opt, loss="mse")
data = np.random.default_rng(rank).standard_normal((64, 10)).astype(np.float32)
net.fit(data[:, :8], data[:, 8:], batch_size=16, epochs=1, verbose=0)
state = hvt.compression_state(topk)
result(rank, case="keras_fit", weights=[float(np.sum(w)) for w in net.get_weights()],
       state=sorted(state.named()))
