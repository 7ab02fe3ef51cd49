"""The Adam take-over (FrozenAdam) through hvdcompress.tensorflow.keras.DistributedOptimizer
under horovodrun: apply_gradients with the exact gradient c_r of loss = sum(w * c_r) (the test
recomputes every step in numpy, tests/adam_reference.py). Cases, each reporting every step's w:

"none":     FrozenAdam(NoCompression, freeze 3), Keras AdamW, 6 eager steps
"onebit":   FrozenAdam(ErrorFeedback(OneBit), freeze 2, send="momentum"), Keras AdamW, 5 eager steps
            (the 2 warm-up steps int8, the default warm-up around onebit)
"function": the same with the default send="gradient", apply_gradients inside a tf.function
"clip":     "none" with clip_grad_norm=5 inside a tf.function (the v-steps clip the mean, kept for the others:
            the same order as the torch front ends, tests/hvd/torch_adam.py)
"schedule": FrozenAdam(ErrorFeedback(OneBit), live_steps=4): the default variance schedule
            (hvdcompress.adam.variance, int8 v-steps) after 4 live steps, 24 steps in a tf.function,
            clip_grad_norm=20
"small":    "schedule" with min_numel=N+1 and no clip, 12 steps: the tensor runs live Adam (int8) at every step
"lr_units": "function" eager, the learning rate assigned before each step (adam_reference.LRS: it
            falls, is 0 once, rises): the compressed steps exchange in lr units, as on torch
"""
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import result

import hvdcompress as hc
import hvdcompress.tensorflow.keras as hvck

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adam_reference import LRS  # noqa: E402 (tests/: the schedule the numpy reference runs)

hvd.init()
rank = hvd.rank()
N = 1000


def gradient(step: int) -> np.ndarray:
    return np.random.default_rng(100 + 10 * step + rank).standard_normal(N).astype(np.float32)


def run(compression, lr, b1, b2, wd, steps, function=False, clip=None, lrs=None) -> tuple:
    w = tf.Variable(np.linspace(-1, 1, N, dtype=np.float32), name="w")
    opt = hvck.DistributedOptimizer(tf.keras.optimizers.AdamW(lr, beta_1=b1, beta_2=b2, epsilon=1e-8,
                                                              weight_decay=wd),
                                    compression=compression, clip_grad_norm=clip)
    apply = (lambda g: opt.apply_gradients([(g, w)]))
    if function:
        apply = tf.function(apply)
    out = []
    for step in range(steps):
        if lrs:
            opt.learning_rate.assign(lrs[step])
        apply(tf.constant(gradient(step)))
        out.append(w.numpy().tolist())
    return out, int(opt.iterations.numpy())


weights, iterations = run(hc.FrozenAdam(hc.NoCompression(), freeze_steps=3), 0.01, 0.9, 0.99, 0.1, 6)
result(rank, case="none", weights=weights, iterations=iterations)
for name, function, send in (("onebit", False, "momentum"), ("function", True, "gradient")):
    weights, iterations = run(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2, send=send),
                              0.01, 0.8, 0.95, 0.05, 5, function)
    result(rank, case=name, weights=weights, iterations=iterations)
weights, iterations = run(hc.FrozenAdam(hc.NoCompression(), freeze_steps=3), 0.01, 0.9, 0.99, 0.1, 6,
                         function=True, clip=5.0)
result(rank, case="clip", weights=weights, iterations=iterations)
weights, iterations = run(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4), 0.01, 0.8, 0.95, 0.05, 24,
                         function=True, clip=20.0)
result(rank, case="schedule", weights=weights, iterations=iterations)
weights, iterations = run(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4, min_numel=N + 1),
                         0.01, 0.8, 0.95, 0.05, 12, function=True)
result(rank, case="small", weights=weights, iterations=iterations)
weights, iterations = run(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2), 0.01, 0.8, 0.95, 0.05,
                         len(LRS), lrs=LRS)
result(rank, case="lr_units", weights=weights, iterations=iterations)
