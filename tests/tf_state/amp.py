"""Loss scaling with the TF tape's ``scaler=`` and the Keras optimizer around a
LossScaleOptimizer, 2 ranks (tests/test_tf_state_change.py). A 16-32-4 MLP, STEPS steps of each
rank's own batches in a ``tf.function``; the loss scale starts at 2^10 and doubles every 3
finite steps. Records, one per case and rank:

* ``tape_<c>``: ``DistributedGradientTape(scaler=LossScaleOptimizer)`` against the run without
  a scaler (``gap``: |w_scaled - w_plain| / |w_plain - w_0|; powers of two scale exactly);
* ``tape_<c>_horovod``: the pattern without ``scaler=`` (``get_unscaled_gradients`` after the
  exchange), whose gap shows that the comparison can fail;
* ``tape_<c>_overflow`` / ``keras_<c>_overflow``: rank 1's loss times inf at step OVERFLOW: the
  compressor state and counters before and after that step (``state_diff``: the largest
  difference, ``keys``: how many entries), the weights (``weights_diff``), the loss scale
  before and after, and the gap to the run without a scaler that skips that step's batches."""
import hashlib
import os
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

hvd.init()
rank = hvd.rank()
STEPS, BATCH, OVERFLOW = 10, 8, 4
COMPRESSORS = {"topk_ef": lambda: hc.ErrorFeedback(hc.TopK(0.1)),
               "dgc": lambda: hc.DGC(0.9, momentum=0.9, min_numel=0)}
data = np.random.default_rng(100 + rank)
X = data.standard_normal((STEPS, BATCH, 16)).astype(np.float32)
Y = data.standard_normal((STEPS, BATCH, 4)).astype(np.float32)


def flat(model) -> np.ndarray:
    return np.concatenate([w.reshape(-1) for w in model.get_weights()])


def snapshot(compressor) -> dict:
    state = hvc.compression_state(compressor)
    out = {f"{name}/{k}": np.array(st[k]) for name, st in state.named().items() for k in st}
    out.update({f"counter/{k}": np.array(v) for k, v in compressor.state_dict().items()})
    return out


def train(make, mode: str, skip: int = -1, poison_at: int = -1) -> dict:
    """One run. ``mode``: "plain" (no loss scale), "scaler" (the tape's scaler=), "horovod"
    (unscaled after the exchange), "keras" (DistributedOptimizer(LossScaleOptimizer))."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                                 tf.keras.layers.Dense(4)])
    start = flat(model)
    compressor = make()
    opt = tf.keras.optimizers.SGD(0.05)
    if mode != "plain":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt, initial_scale=2.0 ** 10, dynamic_growth_steps=3)
    if mode == "keras":
        opt = hvck.DistributedOptimizer(opt, compression=compressor)
    variables = model.trainable_variables

    @tf.function
    def step(x, y, poison):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2) * poison
            if mode != "plain":
                loss = opt.get_scaled_loss(loss)
        if mode == "keras":
            grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
        else:
            tape = hvc.DistributedGradientTape(tape, compression=compressor,
                                               scaler=opt if mode == "scaler" else None)
            grads = tape.gradient(loss, variables)
            if mode == "horovod":
                grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, variables))

    out = {}
    for t in range(STEPS):
        if t == skip:
            continue
        poison = np.float32(np.inf if t == poison_at and rank == 1 else 1.0)
        if t == poison_at:
            before, w_before, scale_before = snapshot(compressor), flat(model), float(opt.loss_scale)
        step(tf.constant(X[t]), tf.constant(Y[t]), tf.constant(poison))
        if t == poison_at:
            after = snapshot(compressor)
            out.update(keys=len(before), same_keys=sorted(before) == sorted(after),
                       state_diff=max(float(np.max(np.abs(before[k].astype(np.float64) - after[k].astype(np.float64))))
                                      if before[k].size else 0.0 for k in before if k in after),
                       weights_diff=float(np.max(np.abs(flat(model) - w_before))),
                       scale_before=scale_before, scale_after=float(opt.loss_scale))
    out.update(weights=flat(model), start=start)
    return out


def gap(a: dict, b: dict) -> float:
    return float(np.linalg.norm(a["weights"] - b["weights"]) / np.linalg.norm(b["weights"] - b["start"]))


for name, make in COMPRESSORS.items():
    plain = train(make, "plain")
    scaled = train(make, "scaler")
    write_result(rank, {"case": f"tape_{name}", "gap": gap(scaled, plain),
                        "checksum": hashlib.sha256(scaled["weights"].tobytes()).hexdigest()[:16]})
    if name == "topk_ef":
        write_result(rank, {"case": f"tape_{name}_horovod", "gap": gap(train(make, "horovod"), plain)})
    skipped = train(make, "plain", skip=OVERFLOW)
    for mode in ("scaler", "keras"):
        run = train(make, mode, poison_at=OVERFLOW)
        write_result(rank, {"case": f"{'tape' if mode == 'scaler' else 'keras'}_{name}_overflow",
                            "gap_skip": gap(run, skipped),
                            "checksum": hashlib.sha256(run["weights"].tobytes()).hexdigest()[:16],
                            **{k: v for k, v in run.items() if k not in ("weights", "start")}})
