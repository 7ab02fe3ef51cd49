"""The compressed allreduce (collective="alltoall") under real Horovod processes, through the
torch optimizer and the TF tape: 1-bit payloads with error feedback on both sides, 2 steps,
SGD lr 1 from w = 0 (torch), and the tape's averaged gradient (TF). Gradients are exact
(loss = sum(w * c)); tests/test_exchange_horovod.py recomputes the results in numpy."""
import sys

import numpy as np
from common import result

import hvdcompress as hc

N, STEPS = 999, 2


def grad(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng(1000 * step + rank).standard_normal(N).astype(np.float32)


if sys.argv[1] == "torch":
    import horovod.torch as hvd
    import torch

    import hvdcompress.torch as hvc
    hvd.init()
    w = torch.nn.Parameter(torch.zeros(N))
    opt = hvc.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   compression=hc.ErrorFeedback(hc.OneBit()), collective=sys.argv[2])
    for step in range(STEPS):
        opt.zero_grad()
        (w * torch.from_numpy(grad(hvd.rank(), step))).sum().backward()
        opt.step()
    result(hvd.rank(), w=w.detach().tolist(), plan=list(opt._exchange.plan["w"]))
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvdcompress.tensorflow as hvc
    hvd.init()
    compressor = hc.ErrorFeedback(hc.OneBit())
    w = tf.Variable(tf.zeros(N), name="w")
    total = np.zeros(N, np.float32)
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * tf.constant(grad(hvd.rank(), step)))
        tape = hvc.DistributedGradientTape(tape, compression=compressor, collective=sys.argv[2])
        total = total - tape.gradient(loss, [w])[0].numpy()
    result(hvd.rank(), w=total.tolist(), plan=list(tape.exchange.engine.plan["w"]))
