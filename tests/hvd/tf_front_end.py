"""The TF front end's behaviours that Horovod's own Keras tests check, in one launch:

* ranks that disagree on variables or compression get a clear error at the first exchange
  (tape and Keras optimizer), not a hang;
* local variables (register_local_source / register_local_var) keep their own gradient and
  stay out of the replica guard;
* backward_passes_per_step=4 with average_aggregated_gradients on and off, with an
  IndexedSlices gradient, inside a tf.function (Horovod's test_gradient_aggregation): the
  weights after every call and ``iterations``, which counts every call.
"""
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


# local variables: w is shared, h is this rank's own; gradients c_r = rank + 1 for both
for front in ("tape", "keras"):
    comp = hc.TopK(2)
    w, h = tf.Variable(tf.zeros([4]), name="w"), tf.Variable(tf.zeros([4]), name="h")
    opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression=comp, check_replicas=1)
    if front == "keras":
        opt.register_local_var(h)
    seen = []
    for step in range(3):  # check_replicas=1: h differs across ranks, and must not trip the guard
        c = tf.fill([4], float(rank + 1))
        if front == "tape":
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * c) + tf.reduce_sum(h * c)
            tape = hvt.DistributedGradientTape(tape, compression=comp, check_replicas=1)
            tape.register_local_source(h)
            gw, gh = tape.gradient(loss, [w, h])
            w.assign_sub(gw)
            h.assign_sub(gh)
        else:
            opt.apply_gradients([(c, w), (c, h)])
        seen.append([w.numpy().tolist(), h.numpy().tolist()])
    result(rank, case=f"{front}.local", weights=seen)


# gradient aggregation (Horovod's test_gradient_aggregation): loss = x - y[0], SGD(1.0)
for average in (True, False):
    x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
    opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression=hc.FP16(),
                                   backward_passes_per_step=4, average_aggregated_gradients=average)

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(x - tf.gather(y, [0]))  # IndexedSlices gradient for y
        grads = tape.gradient(loss, [x, y])
        opt.apply_gradients(zip(grads, [x, y]))

    seen = []
    for _ in range(10):
        train()
        seen.append([float(x.numpy()[0]), *map(float, y.numpy()), int(opt.iterations.numpy())])
    result(rank, case=f"aggregate.{average}", weights=seen)
