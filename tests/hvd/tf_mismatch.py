"""TF: ranks that disagree on variables or compression get a clear error at the first exchange
(tape and Keras optimizer), not a hang; every case in one launch."""
import horovod.tensorflow as hvd
import tensorflow as tf

import hvdcompress as hc
import hvdcompress.tensorflow as hvt
import hvdcompress.tensorflow.keras as hvk
from common import result

hvd.init()
rank = hvd.rank()


def model(case: str) -> tf.keras.Model:
    """Dense(3) on 4 inputs; rank 1 differs by a second layer or a shape in those cases."""
    tf.keras.backend.clear_session()  # the same layer names in every case
    layers = [tf.keras.Input((4,)), tf.keras.layers.Dense(5 if case == "shape" and rank == 1 else 3)]
    if case == "extra_variable" and rank == 1:
        layers.append(tf.keras.layers.Dense(2))
    return tf.keras.Sequential(layers)


for front in ("tape", "keras"):
    for case in ("extra_variable", "shape", "compressor", "same"):
        net = model(case)
        vs = net.trainable_variables
        comp = hc.TopK(3) if case == "compressor" and rank == 1 else hc.TopK(2)
        try:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(net(tf.ones([2, 4])) ** 2)
            if front == "tape":
                hvt.DistributedGradientTape(tape, compression=comp).gradient(loss, vs)
            else:
                opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=comp)
                opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
            result(rank, case=f"{front}.{case}", error=None)
        except ValueError as e:
            result(rank, case=f"{front}.{case}", error=str(e))
