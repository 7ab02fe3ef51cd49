"""A state_dict round trip mid-training gives the same next steps as no round trip."""
import copy
import sys

import horovod.torch as hvd
import torch

import hvdcompress
import hvdcompress.torch as hvc
from common import result
from torch_common import batches, flat, mlp

hvd.init()
torch.set_num_threads(1)
CASES = {
    "dgc_sampled_warmup": lambda: hvdcompress.DGC(
        0.99, min_numel=1000, warmup=hvdcompress.ListWarmup([0.9, 0.99], begin=1, length=4)),
    "topk_ef_nesterov": lambda: hvdcompress.from_params(
        {"compressor": "topk", "k": "0.05", "ef": "vanilla", "momentum": "nesterov"}),
    "randomk_ef": lambda: hvdcompress.from_params(
        {"compressor": "randomk", "k": "0.1", "ef": "vanilla", "seed": "5"}),
}
case = sys.argv[1]


def make(model):
    return hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters(),
                                    compression=CASES[case]())


data = list(batches(hvd.rank(), 8, seed=9))


def run(model, opt, chunk):
    for x, y in chunk:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


model = mlp(seed=3)
opt = make(model)
run(model, opt, data[:4])
saved_model = copy.deepcopy(model.state_dict())
saved_opt = copy.deepcopy(opt.state_dict())
run(model, opt, data[4:])
straight = flat(model).clone()

resumed = mlp(seed=11)  # different init: everything must come from the checkpoint
resumed.load_state_dict(saved_model)
opt2 = make(resumed)
opt2.load_state_dict(saved_opt)
run(resumed, opt2, data[4:])

fresh = mlp(seed=11)  # the same restart without compressor state must differ
fresh.load_state_dict(saved_model)
opt3 = make(fresh)
opt3.load_state_dict({k: v for k, v in saved_opt.items() if k != "hvdcompress"})
run(fresh, opt3, data[4:])
result(hvd.rank(), diff=float((straight - flat(resumed)).abs().max()),
       diff_without_state=float((straight - flat(fresh)).abs().max()),
       state_keys=sorted(saved_opt["hvdcompress"]["tensors"]["0.weight"]))
