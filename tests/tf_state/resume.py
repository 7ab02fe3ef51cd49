"""Resume at another world size on TF / Keras (tests/test_tf_state_change.py).

    resume.py DIR save     (2 ranks: train, gather, rank 0 pickles DIR/<case>.pkl)
    resume.py DIR load     (3 ranks: load it, write each rank's laid-out state, one more step)

Cases: ``keras``: the Keras DistributedOptimizer, onebit + EF + Nesterov momentum taken over from
SGD, collective 'auto' (the allgather at 2 ranks, the compressed allreduce of the large kernel at
3); ``tape``: DistributedGradientTape with DGC's momentum and velocity. Each rank writes its state
as DIR/<case>.<mode>.rank<r>.npz (after saving: as trained; after loading: as laid out) and
reports the kernel's collective."""
import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hvdrun
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
import hvdcompress.tensorflow as hvc  # noqa: E402
import hvdcompress.tensorflow.keras as hvck  # noqa: E402
from hvdcompress.tensorflow.resume import lay_out  # noqa: E402

OUT, MODE = sys.argv[1], sys.argv[2]
hvd.init()
rank, world = hvd.rank(), hvd.size()
STEPS = 4


def model_and_vars():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(50, activation="relu", input_shape=(20,)),
                                 tf.keras.layers.Dense(4)])
    return model, model.trainable_variables


def batch(t: int):
    data = np.random.default_rng(1000 * t + rank)
    return (tf.constant(data.standard_normal((8, 20)).astype(np.float32)),
            tf.constant(data.standard_normal((8, 4)).astype(np.float32)))


def short(name: str) -> str:
    """``dense/kernel`` for Keras 2's name and Keras 3's path (``sequential/dense/kernel``)."""
    return "/".join(name.split("/")[-2:])


def save_npz(path: str, state) -> None:
    np.savez(path, **{f"{short(name)}/{k}": np.asarray(st[k]) for name, st in state.named().items()
                      for k in st if not isinstance(st[k], (int, float))})


def run(case: str) -> None:
    model, variables = model_and_vars()
    if case == "keras":
        opt = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
                                        compression=hc.from_params({"compressor": "onebit", "ef": "vanilla"}))
        target, state = opt, opt._hvdc_exchange.state
    else:
        opt = tf.keras.optimizers.SGD(0.05)
        dgc = hc.DGC(0.9, momentum=0.9, min_numel=0)
        target, state = dgc, hvc.compression_state(dgc)
    exchanges = []

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        if case == "keras":
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
            exchanges.append(opt._hvdc_exchange)
        else:
            tape = hvc.DistributedGradientTape(tape, compression=dgc)
            exchanges.append(tape.exchange)
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    if MODE == "save":
        for t in range(STEPS):
            step(*batch(t))
        saved = hvc.gather_compression_state(target)
        if rank == 0:
            with open(f"{OUT}/{case}.pkl", "wb") as f:
                pickle.dump(saved, f)
    else:
        with open(f"{OUT}/{case}.pkl", "rb") as f:
            saved = pickle.load(f)
        if case == "keras":
            hvc.load_compression_state(opt, saved, variables=variables)   # laid out now
        else:   # laid out by a tape's exchange, as the next step would
            hvc.load_compression_state(dgc, saved)
            tape = hvc.DistributedGradientTape(tf.GradientTape(), compression=dgc)
            lay_out(tape.exchange, variables)
        save_npz(f"{OUT}/{case}.{MODE}.rank{rank}.npz", state)
        step(*batch(STEPS))
        refused = ""
        try:
            hvc.load_compression_state(target, {"ranks": saved["ranks"][0]})
        except ValueError as e:
            refused = str(e)
        write_result(rank, {"case": case, "world": world, "refused": refused,
                            "plan": {short(n): p[1] for n, p in exchanges[-1].engine.plan.items()}})
        return
    save_npz(f"{OUT}/{case}.{MODE}.rank{rank}.npz", state)
    write_result(rank, {"case": case, "world": world,
                        "plan": {short(n): p[1] for n, p in exchanges[-1].engine.plan.items()}})


for case in ("keras", "tape"):
    run(case)
