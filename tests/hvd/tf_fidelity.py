"""Horovod drop-in fidelity for TF and Keras (tests/test_tf_horovod_fidelity.py), one launch:

* ``opt._compute_gradients(loss, var_list, tape=...)`` on every Keras optimizer kind (Keras 2's
  legacy ones through their own ``_compute_gradients``, Keras 2's new ones and Keras 3's through
  the tape), eagerly and in a tf.function, with backward_passes_per_step=2 and
  average_aggregated_gradients on and off, and an inf gradient on rank 0 in the first cycle
  (Horovod's test_grad_aggregation_with_inf_grad): the returned gradients, the weights,
  ``iterations`` and ``_agg_helper.counter`` after each call;
* a tensor loss with ``tape=`` and ``grad_loss=``;
* ``PartialDistributedGradientTape(tape, local_layers=...)`` (a list, a single layer,
  scale_local_gradients=False) and ``get_local_and_global_gradients``;
* ``PartialDistributedOptimizer(opt, local_layers=...)`` with Horovod's
  ``opt._compute_gradients(loss, weights, tape=tape)`` then ``apply_gradients``;
* TF1 graph mode (a Session): ``register_local_source`` and ``get_local_and_global_gradients``.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress.tensorflow as hvt
import hvdcompress.tensorflow.keras as hvk

hvd.init()
rank = hvd.rank()
KERAS2 = not getattr(tf.keras, "__version__", "2").startswith("3")  # TF 2.15's tf.keras: no __version__
KINDS = {"new": tf.keras.optimizers.SGD}
if KERAS2:
    KINDS["legacy"] = tf.keras.optimizers.legacy.SGD


def arr(t) -> list:
    return np.asarray(tf.convert_to_tensor(t), np.float64).tolist()


def c_w(r: int, k: int) -> np.ndarray:   # as tests/test_tf_horovod_fidelity.py
    return np.array([1.0 + r, -2.0 + 0.5 * k], np.float32)


def c_z(r: int, k: int) -> np.ndarray:
    return np.array([np.inf if (r, k) == (0, 0) else 0.5 * (r + 1) * (k + 1)], np.float32)


# ---- 1. aggregation through _compute_gradients ---------------------------------------------------
for kind, sgd in KINDS.items():
    for mode in ("eager", "function"):
        for average in (True, False):
            w, z = tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([1]))
            opt = hvk.DistributedOptimizer(sgd(0.5), backward_passes_per_step=2,
                                           average_aggregated_gradients=average)
            cw, cz = tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([1]))

            def objective():
                return tf.reduce_sum(w * cw) + tf.reduce_sum(z * cz)

            def call():
                pairs = opt._compute_gradients(objective, var_list=[w, z])
                opt.apply_gradients(pairs)
                return [g for g, _ in pairs]

            run = tf.function(call) if mode == "function" else call
            calls = []
            for k in range(4):
                cw.assign(c_w(rank, k))
                cz.assign(c_z(rank, k))
                gw, gz = run()
                calls.append({"gw": arr(gw), "gz": arr(gz), "w": arr(w), "iterations": int(opt.iterations.numpy()),
                              "counter": int(opt._agg_helper.counter.numpy())})
            result(rank, case=f"agg.{kind}.{mode}.{average}", calls=calls)

# ---- 2. a tensor loss with tape= and grad_loss= --------------------------------------------------
for kind, sgd in KINDS.items():
    w = tf.Variable(tf.ones([2]))
    opt = hvk.DistributedOptimizer(sgd(0.5))
    with tf.GradientTape(persistent=True) as tape:
        value = tf.reduce_sum(w * c_w(rank, 0))
    pairs = opt._compute_gradients(value, [w], grad_loss=tf.constant(3.0), tape=tape)
    try:
        opt._compute_gradients(value, [w])
        error = None
    except ValueError as e:
        error = str(e)
    result(rank, case=f"tensor_loss.{kind}", grad=arr(pairs[0][0]), same_variable=pairs[0][1] is w,
           error=error)


# ---- 3./4. PartialDistributedGradientTape and PartialDistributedOptimizer ------------------------
def model() -> tf.keras.Model:
    """Dense(2) then Dense(1), linear; the first layer's kernel and the last bias depend on the rank."""
    tf.keras.backend.clear_session()
    init = tf.keras.initializers.Constant
    return tf.keras.Sequential([
        tf.keras.Input((3,)),
        tf.keras.layers.Dense(2, kernel_initializer=init(0.1 * (rank + 1)), bias_initializer=init(0.2)),
        tf.keras.layers.Dense(1, kernel_initializer=init(0.3), bias_initializer=init(-0.1 * rank))])


X = np.array([[1.0 + rank, 2.0, -1.0], [0.5, -rank, 3.0]], np.float32)
T = np.array([[1.0], [-1.0]], np.float32)


def recorded(net):
    tape = tf.GradientTape(persistent=True)
    with tape:
        loss = 0.5 * tf.reduce_sum((net(X) - T) ** 2)
    return tape, loss


for case, layers, scale in (("list", lambda net: [net.layers[0]], True),
                            ("single_unscaled", lambda net: net.layers[1], False)):
    net = model()
    tape, loss = recorded(net)
    tape = hvt.PartialDistributedGradientTape(tape, local_layers=layers(net), scale_local_gradients=scale)
    grads = tape.gradient(loss, net.trainable_weights)
    local, shared = tape.get_local_and_global_gradients(loss, net.trainable_weights)
    index = {id(v): i for i, v in enumerate(net.trainable_weights)}
    result(rank, case=f"ptape.{case}", grads=[arr(g) for g in grads],
           local=[[index[id(v)], arr(g)] for v, g in local], shared=[[index[id(v)], arr(g)] for v, g in shared])
try:
    hvt.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[model().layers[0], "dense"])
    error = None
except ValueError as e:
    error = str(e)
result(rank, case="ptape.bad_layers", error=error)

for kind, sgd in KINDS.items():
    net = model()
    opt = hvk.PartialDistributedOptimizer(sgd(0.5), local_layers=[net.layers[0]])
    tape, loss = recorded(net)
    pairs = opt._compute_gradients(loss, net.trainable_weights, tape=tape)
    opt.apply_gradients(pairs)
    result(rank, case=f"popt.{kind}", grads=[arr(g) for g, _ in pairs],
           weights=[arr(v) for v in net.trainable_weights])

# ---- 5. TF1 graph mode (a Session) --------------------------------------------------------------
with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    a = tf.compat.v1.Variable(tf.zeros([2]), name="a")
    b = tf.compat.v1.Variable(tf.zeros([2]), name="b")
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(a * c_w(rank, 1)) + tf.reduce_sum(b * c_w(rank, 2))
    tape = hvt.DistributedGradientTape(tape)
    tape.register_local_source(b)
    ga, gb = tape.gradient(loss, [a, b])
    local, shared = tape.get_local_and_global_gradients(loss, [a, b])
    sess.run(tf.compat.v1.global_variables_initializer())
    values = sess.run([ga, gb, [g for _, g in local], [g for _, g in shared]])
    result(rank, case="graph", ga=values[0].tolist(), gb=values[1].tolist(),
           local=[v.tolist() for v in values[2]], shared=[v.tolist() for v in values[3]],
           local_is_b=[v is b for v, _ in local])
