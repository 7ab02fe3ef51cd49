"""The TF front end's behaviours that Horovod's own Keras tests check, in one launch:

* ranks that disagree on variables or compression get a clear error at the first exchange
  (tape and Keras optimizer), not a hang;
* local variables (register_local_source / register_local_var) keep their own gradient and
  stay out of the replica guard;
* backward_passes_per_step=4 with average_aggregated_gradients on and off, with an
  IndexedSlices gradient, inside a tf.function (Horovod's test_gradient_aggregation): the
  weights after every call and ``iterations``, which counts every call; on Keras 2 also through
  a legacy optimizer's ``_compute_gradients``, with ``_agg_helper.counter``;
* Keras 2: the exchange in ``compute_gradients`` / ``_compute_gradients`` (``minimize``,
  ``fit``, Horovod's tests), once per step whichever path: top-k + EF weights, the exchanged
  gradients these return, and the number of exchanges, for the tape path and each of those.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress as hc
import hvdcompress.tensorflow as hvt
import hvdcompress.tensorflow.keras as hvk

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


# local variables: w is shared, h is this rank's own; gradients c_r = rank + 1 for both;
# the tape and the Keras optimizer divide h's by the number of ranks unless scale_local_gradients=False
for front in ("tape", "tape_unscaled", "keras", "keras_unscaled"):
    comp = hc.TopK(2)
    scale_local = not front.endswith("_unscaled")
    w, h = tf.Variable(tf.zeros([4]), name="w"), tf.Variable(tf.zeros([4]), name="h")
    opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), compression=comp, check_replicas=1,
                                   scale_local_gradients=scale_local)
    if not front.startswith("tape"):
        opt.register_local_var(h)
    seen = []
    for step in range(3):  # check_replicas=1: h differs across ranks, and must not trip the guard
        c = tf.fill([4], float(rank + 1))
        if front.startswith("tape"):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * c) + tf.reduce_sum(h * c)
            tape = hvt.DistributedGradientTape(tape, compression=comp, check_replicas=1,
                                               scale_local_gradients=scale_local)
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


KERAS2 = not getattr(tf.keras, "__version__", "2").startswith("3")  # TF 2.15's tf.keras: no __version__
if KERAS2:
    legacy = tf.keras.optimizers.legacy

    # backward_passes_per_step through a legacy optimizer's _compute_gradients, as Horovod's test
    for average in (True, False):
        x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
        opt = hvk.DistributedOptimizer(legacy.SGD(1.0), compression=hc.FP16(), sparse_as_dense=True,
                                       backward_passes_per_step=4, average_aggregated_gradients=average)

        @tf.function
        def train():
            grads_and_vars = opt._compute_gradients(lambda: x - tf.gather(y, [0]), var_list=[x, y])
            opt.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)

        seen = []
        for _ in range(10):
            train()
            seen.append([float(x.numpy()[0]), *map(float, y.numpy()), int(opt.iterations.numpy()),
                         int(opt._agg_helper.counter.numpy())])
        result(rank, case=f"aggregate_computed.{average}", weights=seen)

    # one exchange per step, whichever path: loss = w·c + h·c, h local, c this rank's (step's)
    def c_of(step: int) -> np.ndarray:
        return (np.array([1.0, -3.0, 2.5, 0.5]) * (1 + 0.25 * rank)
                + step * np.array([0.1, 0.2, -0.3, 0.45])).astype(np.float32)

    for path in ("tape", "legacy", "legacy_function", "minimize_function", "compute_function", "dropped"):
        w, h, c = tf.Variable(tf.zeros([4]), name="w"), tf.Variable(tf.zeros([4]), name="h"), tf.Variable(tf.zeros([4]))
        sgd = legacy.SGD(1.0) if path.startswith("legacy") else tf.keras.optimizers.SGD(1.0)
        opt = hvk.DistributedOptimizer(sgd, compression=hc.ErrorFeedback(hc.TopK(2)))
        opt.register_local_var(h)

        def loss():
            return tf.reduce_sum(w * c) + tf.reduce_sum(h * c)

        def step():
            if path in ("tape", "dropped"):
                if path == "dropped":   # compute_gradients's result dropped, then a tape's applied
                    opt.compute_gradients(loss, [w, h])
                with tf.GradientTape() as tape:
                    value = loss()
                grads_and_vars = list(zip(tape.gradient(value, [w, h]), [w, h]))
            elif path.startswith("legacy"):
                grads_and_vars = opt._compute_gradients(loss, var_list=[w, h])
            elif path.startswith("minimize"):
                opt.minimize(loss, [w, h])
                return tf.zeros([4])
            else:
                grads_and_vars = opt.compute_gradients(loss, [w, h])
            opt.apply_gradients(grads_and_vars)
            return grads_and_vars[0][0]

        if path.endswith("function"):
            step = tf.function(step)
        seen = []
        for s in range(3):
            c.assign(c_of(s))
            g = step()
            seen.append([w.numpy().tolist(), h.numpy().tolist(), tf.convert_to_tensor(g).numpy().tolist()])
        result(rank, case=f"once.{path}", weights={"steps": seen, "exchanges": opt.total_bytes.steps})

    # fit (Keras 2: minimize, so compute_gradients) against the tape path on the same model
    def fit_model() -> tf.keras.Model:
        tf.keras.backend.clear_session()
        return tf.keras.Sequential([tf.keras.Input((3,)),
                                    tf.keras.layers.Dense(4, use_bias=False, kernel_initializer="zeros")])

    inputs = np.array([[1.0 + 0.5 * rank, -2.0, 0.75 + 0.25 * rank]], np.float32)
    targets = np.array([[1.0, -0.5, 3.0 + rank, 0.25]], np.float32)
    for path in ("tape", "fit"):
        net = fit_model()
        opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(0.5), compression=hc.ErrorFeedback(hc.TopK(3)))
        if path == "fit":
            net.compile(optimizer=opt, loss=lambda t, p: tf.reduce_sum(p * t, axis=-1))
            net.fit(inputs, targets, batch_size=1, epochs=3, verbose=0, shuffle=False)
        else:
            @tf.function
            def train():
                with tf.GradientTape() as tape:
                    value = tf.reduce_sum(net(inputs, training=True) * targets)
                opt.apply_gradients(zip(tape.gradient(value, net.trainable_variables), net.trainable_variables))

            for _ in range(3):
                train()
        result(rank, case=f"once.fit_{path}", weights={"kernel": net.get_weights()[0].tolist(),
                                                       "exchanges": opt.total_bytes.steps})
