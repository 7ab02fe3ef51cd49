"""compression="auto" on the TF front ends under horovodrun, in one launch:

* ``tape``: eager DistributedGradientTape, one Auto (from_params: link given, codec time left
  out) handed to every step's tape;
* ``keras``: model.fit with the Keras DistributedOptimizer and compression="auto" with the link
  given and this machine's calibration (HOME points to a fresh directory): the plan is made at
  the first exchange, inside fit's tf.function.

Each reports the plan, the re-plan check and a hash of the weights (check_replicas=1 compares
them at every step).
"""
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress as hc
import hvdcompress.tensorflow as hvt
import hvdcompress.tensorflow.keras as hvk

STEPS = 10
hvd.init()
rank = hvd.rank()


def model() -> tf.keras.Model:
    tf.keras.backend.clear_session()
    net = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                               tf.keras.layers.Dense(10)])
    hvd.broadcast_variables(net.variables, root_rank=0)
    return net


def report(case: str, net: tf.keras.Model, auto, first=None) -> None:
    weights = np.concatenate([v.numpy().ravel() for v in net.trainable_variables])
    result(rank, case=case, first=first, plan=auto.plan, checks=auto.checks,
           shapes={v.name: list(v.shape) for v in net.trainable_variables},
           params=hashlib.sha256(weights.tobytes()).hexdigest())


data = np.random.default_rng(rank)
x = data.standard_normal((16 * STEPS, 64)).astype(np.float32)
y = data.integers(0, 10, 16 * STEPS)

net = model()
auto = hc.from_params({"compressor": "auto", "link": "100mbit,50us", "calibration": "none"})
sgd = tf.keras.optimizers.SGD(0.05)
first = None
for step in range(STEPS):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            y[16 * step:16 * step + 16], net(x[16 * step:16 * step + 16]), from_logits=True))
    tape = hvt.DistributedGradientTape(tape, compression=auto, check_replicas=1)
    grads = tape.gradient(loss, net.trainable_variables)
    sgd.apply_gradients(zip(grads, net.trainable_variables))
    first = first or auto.plan
report("tape", net, auto, first)

net = model()
opt = hvk.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression="auto",
                               link={"bandwidth": "100mbit", "latency": "50us"}, check_replicas=1)
net.compile(optimizer=opt, jit_compile=False,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
net.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
report("keras", net, opt._hvdc_exchange.compressor, opt._hvdc_exchange.compressor.plan)
