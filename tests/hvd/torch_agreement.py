"""Ranks that disagree on any setting of the exchange (tests/test_agreement.py), every case in
one launch: for each, rank 1 builds hvdcompress.torch.DistributedOptimizer with one setting
changed, and every rank records the error of the construction (the rank agreement runs there)
or, when it passes, trains one step (a disagreement the check missed would hang there or drift:
the launch's time limit turns a hang into a failure) and records its parameters."""
import horovod.torch as hvd
import torch
from common import result

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()

#: case -> (rank 0's keyword arguments, rank 1's); a "model" entry picks the model's widths / dtype
CASES = {
    "ef_fp16_vs_bf16": ({"compression": hc.ErrorFeedback(hc.FP16())}, {"compression": hc.ErrorFeedback(hc.BF16())}),
    "ef_none_vs_fp16": ({"compression": hc.ErrorFeedback(hc.NoCompression())},
                        {"compression": hc.ErrorFeedback(hc.FP16())}),
    "clip_one_rank": ({"clip_grad_norm": 1.0}, {}),
    "predivide": ({"gradient_predivide_factor": 2.0}, {}),
    "sparse_as_dense": ({"sparse_as_dense": True}, {}),
    "fusion": ({"fusion": True}, {}),
    "collective": ({"compression": hc.ErrorFeedback(hc.OneBit()), "collective": "alltoall"},
                   {"compression": hc.ErrorFeedback(hc.OneBit()), "collective": "allgather"}),
    "op": ({}, {"op": hvd.Sum}),
    "backward_passes_per_step": ({}, {"backward_passes_per_step": 2}),
    "shape": ({}, {"model": (4, 5, torch.float32)}),
    "dtype": ({}, {"model": (4, 3, torch.float64)}),
    "same": ({"compression": hc.ErrorFeedback(hc.FP16()), "clip_grad_norm": 1.0},
             {"compression": hc.ErrorFeedback(hc.FP16()), "clip_grad_norm": 1.0}),
}


def run(case: str) -> None:
    options = dict(CASES[case][min(rank, 1)])
    inputs, hidden, dtype = options.pop("model", (4, 3, torch.float32))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.Linear(hidden, 2)).to(dtype)
    options.setdefault("compression", hc.FP16())
    try:
        opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), **options)
    except ValueError as error:
        result(rank, case=case, error=str(error), params=None)
        return
    x = torch.full((2, inputs), float(rank + 1), dtype=dtype)
    model(x).sum().backward()
    opt.step()
    result(rank, case=case, error=None, params=[p.detach().reshape(-1).tolist() for p in model.parameters()])


for name in CASES:
    run(name)
