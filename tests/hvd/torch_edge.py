"""Unusual gradients and optimizer features under 2 ranks; each case reports what it saw."""
import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
rank = hvd.rank()


def wrap(model, comp, **kw):
    return hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(), compression=comp, **kw)


# NaN on rank 1 reaches every rank; the next, finite step is finite again (no NaN left in a
# residual or momentum): DGC without and with masking, DGC's dense path for small tensors, CSC
NAN_CASES = {"topk_ef": hc.ErrorFeedback(hc.TopK(5)), "dgc": hc.DGC(0.99, min_numel=0),
             "dgc_masking": hc.DGC(0.99, min_numel=0, masking=True), "dgc_dense": hc.DGC(0.99),
             "csc": hc.CSC(0.1, chunk=10, min_numel=0)}
for label, comp in NAN_CASES.items():
    model = Linear(100)
    opt = wrap(model, comp)
    grads = []
    for step in range(2):
        c = torch.from_numpy(rank_vector(rank, 100))
        if step == 0 and rank == 1:
            c[7] = float("nan")
        opt.zero_grad()
        model(c).backward()
        opt.synchronize()
        grads.append(model.w.grad.clone())
        with opt.skip_synchronize():
            opt.step()
    result(rank, case=f"nan_{label}", nan_at_7=bool(torch.isnan(grads[0][7])),
           nan_count=int(torch.isnan(grads[0]).sum()), next_finite=bool(torch.isfinite(grads[1]).all()))


# a parameter rank 1 never uses: its gradient is None there, zeros are sent
class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(50))
        self.b = torch.nn.Parameter(torch.zeros(50))
        self.empty = torch.nn.Parameter(torch.zeros(0))

    def forward(self, c, use_b):
        return (self.a * c).sum() + ((self.b * c).sum() if use_b else 0) + self.empty.sum()


model = TwoHeads()
opt = wrap(model, hc.TopK(100))  # k larger than the tensors: the whole tensor is sent
opt.zero_grad()
model(torch.from_numpy(rank_vector(rank, 50)), use_b=rank == 0).backward()
opt.step()
result(rank, case="unused_and_small", a=model.a.grad.tolist(), b=model.b.grad.tolist(),
       empty=list(model.empty.grad.shape))

# backward_passes_per_step=2: two accumulated backward passes, one exchange
model = Linear(200)
opt = wrap(model, hc.TopK(20), backward_passes_per_step=2)
opt.zero_grad()
for k in range(2):
    model(torch.from_numpy(rank_vector(rank + 10 * k, 200))).backward()
opt.synchronize()
result(rank, case="bpps2", grad=model.w.grad.tolist())
try:
    for k in range(3):
        model(torch.from_numpy(rank_vector(rank, 200))).backward()
    error = None
except AssertionError as e:
    error = str(e)
result(rank, case="bpps_exceeded", error=error)

# groups: parameters exchanged together give the same result as one by one
outs = []
for groups in (None, 1, 2):
    model = TwoHeads()
    opt = wrap(model, hc.DGC(0.9, min_numel=0, momentum=0.0), groups=groups)
    opt.zero_grad()
    model(torch.from_numpy(rank_vector(rank, 50)), use_b=True).backward()
    opt.step()
    outs.append(torch.cat([model.a.detach(), model.b.detach()]))
result(rank, case="groups", same=all(bool(torch.equal(outs[0], o)) for o in outs))

# zero_grad() between backward and step is refused (it would race with communication)
model = Linear(10)
opt = wrap(model, hc.TopK(2), backward_passes_per_step=1)
opt.zero_grad()
model(torch.ones(10)).backward()
try:
    opt.zero_grad()
    error = None
except AssertionError as e:
    error = str(e)
opt.step()
result(rank, case="zero_grad_race", error=error)

# sparse embedding gradients: through Horovod's sparse allreduce, or densified and compressed
for sparse_as_dense in (False, True):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 4, sparse=True)
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(),
                                   compression=hc.TopK(1.0), sparse_as_dense=sparse_as_dense)
    opt.zero_grad()
    emb(torch.tensor([rank, 5])).sum().backward()
    opt.step()
    g = emb.weight.grad
    result(rank, case=f"embedding_sparse_as_dense={sparse_as_dense}",
           grad=(g.to_dense() if g.is_sparse else g).tolist())

# broadcast_optimizer_state: no exchange, no compressor step; rank 0's schedule wins
dgc = hc.DGC(0.9, min_numel=0, warmup=hc.ListWarmup([0.5, 0.9], begin=0, length=4))
if rank == 0:
    dgc.load_state_dict({"step": 3, "epoch": 0})
model = Linear(30)
opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), compression=dgc)
hvc.broadcast_optimizer_state(opt, root_rank=0)
result(rank, case="broadcast_state", steps=opt.total_bytes.steps, dgc_step=dgc.state_dict()["step"],
       grad_none=model.w.grad is None)
