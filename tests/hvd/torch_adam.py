"""The Adam take-over (FrozenAdam) through hvdcompress.torch.DistributedOptimizer under
horovodrun. Gradients are exact: loss = sum(w * c), so grad w = c (the test recomputes every
step in numpy). Cases, each reporting every step's weights:

"none":   FrozenAdam(NoCompression, freeze 3), AdamW, 6 steps (equals Adam with v frozen at 3)
"torch":  plain torch AdamW through the optimizer with no compression (the reference for "none"
          before the freeze)
"onebit": FrozenAdam(ErrorFeedback(OneBit), freeze 2, send="momentum"), Adam with L2 weight
          decay, 5 steps (its 2 warm-up steps int8, the default warm-up around onebit)
"resume": "onebit" for 3 steps, state_dict() into a new optimizer, 2 more steps
"a2a":    the compressed allreduce (collective='alltoall') of "onebit", 5 steps
"gradient": "onebit" with the default send="gradient" (each rank's gradient compressed after the freeze);
"preconditioned": the same with send="preconditioned" (g_r / sqrt(v_hat) compressed)
"clip":   "none" with clip_grad_norm=5 (the v-steps clip the mean, its coefficient scales the others)
"dense_warmup": "gradient" with warmup="none" (the warm-up allreduced dense)
"schedule": FrozenAdam(ErrorFeedback(OneBit), live_steps=4): the default variance schedule of
          hvdcompress.adam.variance (v-steps int8) after 4 live steps instead of 128, Adam, 24 steps,
          clip_grad_norm=20 (the mean's clip in the v-steps, kept for the others)
"schedule_a2a": "schedule" without the clip through the compressed allreduce
"int4_a2a": "schedule_a2a" with warmup="int4": 4-bit v-steps, the reduced sum re-sent in chunks of 64
"lr_units": "gradient" with the lr set before each step (adam_reference.LRS: it falls, is 0 once, rises again): the
          compressed steps send u·g, u = lr / (the first compressed lr), and divide the mean by u
"small":  "schedule" with min_numel=N+1: the tensor is small, so it runs live Adam (int8) at every step
          (clipped to 20 as the schedule's steps say)
"""
import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adam_reference import LRS  # noqa: E402 (tests/: the schedule the numpy reference runs)

hvd.init()
rank = hvd.rank()
N = 1000


def gradient(step: int) -> torch.Tensor:
    return torch.from_numpy(rank_vector(rank, N, seed=100 + 10 * step))


def make(compression, kind: str = "adamw", **kwargs):
    model = Linear(N)
    with torch.no_grad():
        model.w.copy_(torch.linspace(-1, 1, N))
    if kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.95), weight_decay=0.05)
    return model, hvc.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=compression, **kwargs)


def train(model, opt, steps, first: int = 0, lrs=None) -> list:
    out = []
    for step in range(first, first + steps):
        for group in opt.param_groups if lrs else ():
            group["lr"] = lrs[step]
        opt.zero_grad()
        model(gradient(step)).backward()
        opt.step()
        out.append(model.w.detach().tolist())
    return out


model, opt = make(hc.FrozenAdam(hc.NoCompression(), freeze_steps=3))
result(rank, case="none", weights=train(model, opt, 6))
model, opt = make(None)
result(rank, case="torch", weights=train(model, opt, 6))


def onebit():
    return hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2, send="momentum")


model, opt = make(onebit(), kind="adam")
weights = train(model, opt, 5)
result(rank, case="onebit", weights=weights, sent=opt.last_step_bytes.sent, dense=opt.last_step_bytes.dense,
       state=sorted(opt.state_dict()["hvdcompress"]["tensors"]["w"]),
       compressor_state=opt.state_dict()["hvdcompress"]["compressor"])

model, opt = make(onebit(), kind="adam")
first = train(model, opt, 3)
saved = opt.state_dict()
model2, opt2 = make(onebit(), kind="adam")
with torch.no_grad():
    model2.w.copy_(model.w)
opt2.load_state_dict(saved)
result(rank, case="resume", weights=first + train(model2, opt2, 2, first=3))

model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2), kind="adam")  # default send
result(rank, case="gradient", weights=train(model, opt, 5))
model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2, send="preconditioned"), kind="adam")
result(rank, case="preconditioned", weights=train(model, opt, 5))
model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2), kind="adam")
result(rank, case="lr_units", weights=train(model, opt, len(LRS), lrs=LRS),
       compressor_state=opt.state_dict()["hvdcompress"]["compressor"])

model, opt = make(onebit(), kind="adam", collective="alltoall")
result(rank, case="a2a", weights=train(model, opt, 5))

model, opt = make(hc.FrozenAdam(hc.NoCompression(), freeze_steps=3), clip_grad_norm=5.0)
result(rank, case="clip", weights=train(model, opt, 6))

model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2, warmup="none"), kind="adam")
result(rank, case="dense_warmup", weights=train(model, opt, 5))

model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4), kind="adam", clip_grad_norm=20.0)
weights = train(model, opt, 24)
result(rank, case="schedule", weights=weights, sent=opt.total_bytes.sent, dense=opt.total_bytes.dense,
       compressor_state=opt.state_dict()["hvdcompress"]["compressor"])
model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4), kind="adam", collective="alltoall")
result(rank, case="schedule_a2a", weights=train(model, opt, 24))
model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4, warmup="int4"), kind="adam",
                  collective="alltoall")
result(rank, case="int4_a2a", weights=train(model, opt, 8))
model, opt = make(hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), live_steps=4, min_numel=N + 1), kind="adam",
                  clip_grad_norm=20.0)
result(rank, case="small", weights=train(model, opt, 12), sent=opt.total_bytes.sent, dense=opt.total_bytes.dense)
