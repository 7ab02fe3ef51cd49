"""Two-level compression through hvdcompress.tensorflow.DistributedGradientTape at 4 ranks (2
nodes x 2, emulated with ranks_per_node=2; process sets registered at hvd.init): FP16 inside
the node + ErrorFeedback(OneBit) across, 3 steps of the averaged gradient of
loss = sum(w * g_r) (reported as minus their sum, to compare with tests/test_two_level.py's
numpy reference), the second and third step inside a tf.function (the exchange in its
py_function); then NoCompression on both levels through the Keras optimizer (SGD lr 1 from 0)
next to the flat one, on integer-valued gradients."""
import sys
from pathlib import Path

# tests/: the numpy reference's gradients. First: it imports horovod.torch, and Horovod's
# ProcessSet objects answer through the framework module imported last, which must be TF's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from common import result  # noqa: E402
from test_two_level import gradient  # noqa: E402

import hvdcompress as hc  # noqa: E402
import hvdcompress.tensorflow as hvc  # noqa: E402
import hvdcompress.tensorflow.keras as hvck  # noqa: E402

hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=2))
rank = hvd.rank()
N = 999
compressor = hc.ErrorFeedback(hc.OneBit())
w = tf.Variable(tf.zeros(N), name="w")


def averaged(g: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * g)
    tape = hvc.DistributedGradientTape(tape, compression=compressor, intra_node=hc.FP16(),
                                       ranks_per_node=2)
    return tape.gradient(loss, [w])[0]


total = -averaged(tf.constant(gradient(rank, N, 0))).numpy()
graph = tf.function(averaged)
for step in (1, 2):
    total = total - graph(tf.constant(gradient(rank, N, 100 * step))).numpy()

finals = {}
for name, intra in (("exact", hc.NoCompression()), ("flat", None)):
    v = tf.Variable(tf.zeros(1001), name=f"v_{name}")
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), intra_node=intra,
                                    ranks_per_node=2 if intra is not None else None)
    for step in range(2):
        opt.apply_gradients([(tf.constant(gradient(rank, 1001, 100 * step, True)), v)])
    finals[name] = v.numpy().tolist()
result(rank, w=total.tolist(), **finals)
