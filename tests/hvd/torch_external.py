"""tests/test_external_compressor.py on the Horovod torch optimizer (horovodrun -np 2 --gloo):
tests/external_compressor.py's HalfTopK, built by name with from_params, trains.

* "exact": w = 0, loss = sum(w * c_r) (grad = c_r, tests/hvd/torch_common.rank_vector), SGD lr=1,
  one step: the averaged gradient the optimizer applied and w (= -that gradient), the bytes sent;
* "ef": the same with error feedback, 3 steps of c_{r,s} (seed 200 + 10 s): w after each step;
* "train": an MLP, top-k + EF, 30 steps on a fixed batch per rank: the losses and the final
  parameters' sha256.
"""
import hashlib
import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, flat, mlp, rank_vector

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the external compressor
import external_compressor  # noqa: E402,F401  registers "halftopk"

import hvdcompress  # noqa: E402
import hvdcompress.torch as hvc  # noqa: E402

N = 1000
hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()


def linear_run(spec: dict, seeds: list) -> tuple:
    model = Linear(N)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcompress.from_params(spec))
    ws, grads = [], []
    for seed in seeds:
        opt.zero_grad()
        model(torch.from_numpy(rank_vector(rank, N, seed))).backward()
        opt.step()
        grads.append(model.w.grad.tolist())
        ws.append(model.w.detach().tolist())
    return ws, grads, opt


ws, grads, opt = linear_run({"compressor": "halftopk", "k": "0.05"}, [100])
result(rank, case="exact", w=ws[0], grad=grads[0], sent=opt.last_step_bytes.sent,
       dense=opt.last_step_bytes.dense)

ws, _, _ = linear_run({"compressor": "halftopk", "k": "0.05", "ef": "vanilla"}, [200 + 10 * s for s in range(3)])
result(rank, case="ef", ws=ws)

model = mlp()
opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(),
                               compression=hvdcompress.from_params({"compressor": "halftopk", "k": "0.05",
                                                                    "ef": "vanilla"}))
gen = torch.Generator().manual_seed(rank)
x = torch.randn(32, 64, generator=gen)
y = (x[:, :10] * 3).argmax(1)
losses = []
for _ in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
result(rank, case="train", losses=losses, params=hashlib.sha256(flat(model).numpy().tobytes()).hexdigest(),
       sent=opt.last_step_bytes.sent, dense=opt.last_step_bytes.dense)
