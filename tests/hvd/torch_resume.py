"""A state_dict round trip mid-training gives the same next steps as no round trip.

argv[1] names the cases to run, comma-separated: each a compressor and the optimizer's keyword
arguments; every case is reported with case=. The compressed
allreduce cases keep their error-feedback residuals per segment (``seg<j>.residual``) and of
the reduced segment (``sum.residual``), under ``cross.`` for two-level (np=4, 2 ranks per
node, whose process sets are registered at hvd.init)."""
import copy
import sys

import horovod.torch as hvd
import torch
from common import result
from torch_common import batches, flat, mlp

import hvdcompress
import hvdcompress.torch as hvc

CASES = {
    "dgc_sampled_warmup": lambda: hvdcompress.DGC(
        0.99, min_numel=1000, warmup=hvdcompress.ListWarmup([0.9, 0.99], begin=1, length=4)),
    "topk_ef_nesterov": lambda: hvdcompress.from_params(
        {"compressor": "topk", "k": "0.05", "ef": "vanilla", "momentum": "nesterov"}),
    "randomk_ef": lambda: hvdcompress.from_params(
        {"compressor": "randomk", "k": "0.1", "ef": "vanilla", "seed": "5"}),
    "onebit_ef_alltoall": lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()),
    "two_level_onebit_ef": lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()),
}
OPTIONS = {  # the optimizer's keyword arguments besides compression=
    "onebit_ef_alltoall": lambda: {"collective": "alltoall"},
    "two_level_onebit_ef": lambda: {"collective": "alltoall", "intra_node": hvdcompress.FP16(),
                                    "ranks_per_node": 2},
}
cases = sys.argv[1].split(",")
per_node = next((OPTIONS[c]()["ranks_per_node"] for c in cases
                 if "ranks_per_node" in OPTIONS.get(c, dict)()), None)
hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=per_node) if per_node else None)
torch.set_num_threads(1)


def make(model, case: str):
    return hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model.named_parameters(),
                                    compression=CASES[case](), **OPTIONS.get(case, dict)())


data = list(batches(hvd.rank(), 8, seed=9))


def run(model, opt, chunk):
    for x, y in chunk:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def round_trip(case: str) -> None:
    model = mlp(seed=3)
    opt = make(model, case)
    run(model, opt, data[:4])
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    run(model, opt, data[4:])
    straight = flat(model).clone()

    resumed = mlp(seed=11)  # different init: everything must come from the checkpoint
    resumed.load_state_dict(saved_model)
    opt2 = make(resumed, case)
    opt2.load_state_dict(saved_opt)
    run(resumed, opt2, data[4:])

    fresh = mlp(seed=11)  # the same restart without compressor state must differ
    fresh.load_state_dict(saved_model)
    opt3 = make(fresh, case)
    opt3.load_state_dict({k: v for k, v in saved_opt.items() if k != "hvdcompress"})
    run(fresh, opt3, data[4:])
    result(hvd.rank(), case=case, diff=float((straight - flat(resumed)).abs().max()),
           diff_without_state=float((straight - flat(fresh)).abs().max()),
           state_keys=sorted(saved_opt["hvdcompress"]["tensors"]["0.weight"]))


for case in cases:
    round_trip(case)
