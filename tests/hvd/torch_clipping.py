"""Clipping with compression under 2 ranks (issue: clipping with compression).

Model: two parameters a (60) and b (40) with loss = sum(a * ca) + sum(b * cb), so rank r's
gradient is exactly its vectors; tests/test_clipping.py recomputes every result in numpy.
Cases:
  clip_<spec>:  DistributedOptimizer(clip_grad_norm=C) for 2 steps, SGD lr 0.1 (no momentum)
  clip_bpps2*:  the same with backward_passes_per_step=2 (two accumulated passes, one clip)
  warn_*:       which warnings the clipping trap and the recommended path raise"""
import warnings

import horovod.torch as hvd
import torch
from common import result
from torch_common import rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
rank = hvd.rank()
C = 1.5


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(60))
        self.b = torch.nn.Parameter(torch.zeros(40))

    def forward(self, ca, cb):
        return (self.a * ca).sum() + (self.b * cb).sum()


def grads(step, part=0):
    seed = 1000 + 100 * step + 10 * part
    return (torch.from_numpy(rank_vector(rank, 60, seed=seed)),
            torch.from_numpy(rank_vector(rank, 40, seed=seed + 5)))


def run(compression, passes=1, steps=2, momentum=0.0, **kw):
    model = Two()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes, **kw)
    for step in range(steps):
        opt.zero_grad()
        for part in range(passes):
            model(*grads(step, part)).backward()
        opt.step()
    return model


for label, comp in (("none", hc.NoCompression()), ("topk_ef", hc.ErrorFeedback(hc.TopK(10)))):
    model = run(comp, clip_grad_norm=C)
    result(rank, case=f"clip_{label}", a=model.a.detach().tolist(), b=model.b.detach().tolist())
for label, comp in (("", hc.NoCompression()), ("_topk_ef", hc.ErrorFeedback(hc.TopK(10)))):
    model = run(comp, passes=2, steps=1, clip_grad_norm=C)
    result(rank, case=f"clip_bpps2{label}", a=model.a.detach().tolist(), b=model.b.detach().tolist())


def trap(compression, clip_after: bool, **kw):
    """One step with Horovod's clipping pattern (clip after synchronize) or without it."""
    model = Two()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            opt.zero_grad()
            model(*grads(step)).backward()
            opt.synchronize()
            if clip_after:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            with opt.skip_synchronize():
                opt.step()
    return [str(w.message) for w in caught]


result(rank, case="warn_dgc_trap", warnings=trap(hc.DGC(0.9, min_numel=0), clip_after=True))
result(rank, case="warn_ef_trap", warnings=trap(hc.ErrorFeedback(hc.TopK(10)), clip_after=True))
result(rank, case="warn_dgc_recommended",
       warnings=trap(hc.DGC(0.9, min_numel=0), clip_after=False, clip_grad_norm=C))
result(rank, case="warn_none_horovod_pattern", warnings=trap(hc.NoCompression(), clip_after=True))
