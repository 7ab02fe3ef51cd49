"""Compression under ``hvd.elastic.run`` on TF / Keras: 2 ranks, grown to 3, shrunk to 2
(tests/test_tf_state_change.py; the pattern of tests/hvd/torch_elastic.py).

    elastic.py DIR       (the hosts file is $HVDCOMPRESS_HOSTS, read by
                          tests/hvd/elastic_discovery.sh)

Every batch is one step, in a ``tf.function``, of the Keras DistributedOptimizer with onebit and
error feedback (collective 'auto': the allgather at 2 ranks, the compressed allreduce of the
large kernel at 3), with the replica guard on every step, then a commit.
:func:`world_wanted` says how many ranks each batch should run on; while the world differs,
rank 0 writes the hosts file and every rank waits at ``check_host_updates`` (at most WAIT_S).
On entering ``train`` after a reset every rank lays the loaded state out and writes it
(DIR/b<batch>.new.rank<r>.npz), and rank 0 the last commit's gathered states of the old ranks
(DIR/b<batch>.old.rank<r>.npz). Records: one per rank and batch (world, a digest of the
weights, the kernel's collective), and one per entry after a reset."""
import hashlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hvdrun
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hvd"))  # common
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from common import dump_stacks_before_kill, save_reset_states, wait_for_world  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
import hvdcompress.tensorflow.keras as hvck  # noqa: E402
from hvdcompress.tensorflow.elastic import TensorFlowKerasState  # noqa: E402
from hvdcompress.tensorflow.resume import lay_out  # noqa: E402

BATCHES = 8
WAIT_S = 120.0
OUT = sys.argv[1]


def world_wanted(batch: int) -> int:
    return 2 if batch < 3 else 3 if batch < 6 else 2


hvd.init()
dump_stacks_before_kill()
tf.keras.utils.set_random_seed(1)   # every rank the same; a joining rank gets rank 0's weights in sync()
model = tf.keras.Sequential([tf.keras.Input(shape=(20,)), tf.keras.layers.Dense(50, activation="relu"),
                             tf.keras.layers.Dense(4)])
variables = model.trainable_variables
opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), check_replicas=1,
                                compression=hc.from_params({"compressor": "onebit", "ef": "vanilla"}))
opt.build(variables)   # the slots exist on every rank before sync() broadcasts them
state = TensorFlowKerasState(model, opt, batch=0)


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def short(name: str) -> str:
    """``dense/kernel`` for Keras 2's name and Keras 3's path (``sequential/dense/kernel``)."""
    return "/".join(name.split("/")[-2:])


def digest() -> str:
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.variables)).hexdigest()[:16]


@hvd.elastic.run
def train(state):
    rank, world = hvd.rank(), hvd.size()
    if state.batch:
        saved = state._handlers[0].saved
        lay_out(opt._hvdc_exchange, variables)   # what the next step would do first (local)
        save_reset_states(OUT, state.batch, rank,
                          {n: dict(st.items()) for n, st in opt._hvdc_exchange.state.named().items()},
                          saved["ranks"], key=short)
        write_result(rank, {"event": "entry", "batch": state.batch, "world": world,
                            "old_world": len(saved["ranks"])})
    waited = time.monotonic()
    while state.batch < BATCHES:
        if world_wanted(state.batch) != world:
            wait_for_world(state, state.batch, rank, world, world_wanted(state.batch), waited, WAIT_S)
            continue
        data = np.random.default_rng(1000 * state.batch + rank)
        step(tf.constant(data.standard_normal((8, 20)).astype(np.float32)),
             tf.constant(data.standard_normal((8, 4)).astype(np.float32)))
        state.batch += 1
        write_result(rank, {"event": "step", "batch": state.batch, "world": world, "digest": digest(),
                            "collective": {short(n): p[1] for n, p in opt._hvdc_exchange.engine.plan.items()}["dense/kernel"]})
        state.commit()
        waited = time.monotonic()


train(state)
