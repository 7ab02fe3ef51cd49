"""Horovod's own optimizer behaviours (test/parallel/test_torch.py of horovod/horovod, the
optimizer tests), run on hvdcompress's optimizer with the compression given in argv[1] ("none"
or "fp16"). Each case reports what it saw; tests/test_horovod_compat.py checks it."""
import sys
import warnings

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from common import result

import hvdcompress.torch as hvc

hvd.init()
rank, size = hvd.rank(), hvd.size()
SPEC = {"compressor": sys.argv[1]}


def wrap(opt, named=None, **kw):
    return hvc.DistributedOptimizer(opt, named_parameters=named, compression=SPEC, **kw)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


# _parameter_names, with and without named_parameters (Horovod's names)
net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
unnamed = wrap(torch.optim.SGD(net.parameters(), lr=0.1))
named = wrap(torch.optim.SGD(net.parameters(), lr=0.1), named=net.named_parameters())
result(rank, case="parameter_names",
       unnamed=[unnamed._parameter_names[p] for p in net.parameters()],
       named=[named._parameter_names[p] for p in net.parameters()])

# duplicate and missing names: ValueError (no collective is started, so no hang)
errors = {}
a, b = torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1)
for label, params, names in (
        ("duplicate", list(a.parameters()) + list(b.parameters()),
         list(a.named_parameters()) + list(b.named_parameters())),
        ("missing", list(a.parameters()), list(a.named_parameters())[:1])):
    try:
        wrap(torch.optim.SGD(params, lr=0.1), named=names)
        errors[label] = None
    except ValueError as e:
        errors[label] = str(e)
result(rank, case="bad_names", **errors)

# dynamic requires_grad: a generator and a discriminator, each with its own optimizer
torch.manual_seed(0)
gen, disc = torch.nn.Conv2d(1, 4, 1), torch.nn.Conv2d(4, 1, 1)
hvd.broadcast_parameters(gen.state_dict(), root_rank=0)
hvd.broadcast_parameters(disc.state_dict(), root_rank=0)
gen_opt = wrap(torch.optim.SGD(gen.parameters(), lr=0.1), named=gen.named_parameters())
disc_opt = wrap(torch.optim.SGD(disc.parameters(), lr=0.1), named=disc.named_parameters())
inp = torch.rand([1, 1, 8, 8], generator=torch.Generator().manual_seed(rank))
moved = []
for step in range(4):
    train_gen = step % 2 == 0
    for p in gen.parameters():
        p.requires_grad_(train_gen)
    for p in disc.parameters():
        p.requires_grad_(not train_gen)
    before = (flat(gen), flat(disc))
    gen_opt.zero_grad()
    disc_opt.zero_grad()
    disc(gen(inp)).sum().backward()
    (gen_opt if train_gen else disc_opt).step()
    moved.append([flat(gen) != before[0], flat(disc) != before[1]])
result(rank, case="dynamic_requires_grad", moved=moved, gen=flat(gen), disc=flat(disc))

# gradient clipping between synchronize() and step() (Horovod's documented pattern)
model = torch.nn.Linear(1, 1)
model.weight = torch.nn.Parameter(torch.zeros(1, 1) + 0.5)
model.bias = torch.nn.Parameter(torch.zeros(1))
opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1), named=model.named_parameters())
x, y = torch.ones(1, 1), torch.ones(1, 1)
opt.zero_grad()
F.mse_loss(model(x), y).backward()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.synchronize()
    prior = model.weight.grad.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    clipped = model.weight.grad.item()
    with opt.skip_synchronize():
        opt.step()
result(rank, case="clip_after_synchronize", prior=prior, clipped=clipped,
       weight=model.weight.item(), bias=model.bias.item(), warnings=[str(w.message) for w in caught])

# synchronize() then step() without skip_synchronize(): exactly one warning
model = torch.nn.Linear(1, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1), named=model.named_parameters())
opt.zero_grad()
F.mse_loss(model(torch.zeros(1, 1)), torch.ones(1, 1)).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
result(rank, case="synchronize_step_warning", warnings=[str(w.message) for w in caught])

# sparse embeddings, with and without sparse_as_dense: rank r looks up rows r and 3
for as_dense in (False, True):
    emb = torch.nn.Embedding(5, 3, sparse=True)
    torch.nn.init.zeros_(emb.weight)
    opt = wrap(torch.optim.SGD(emb.parameters(), lr=1.0), named=emb.named_parameters(),
               sparse_as_dense=as_dense)
    opt.zero_grad()
    (emb(torch.tensor([rank, 3])).sum(dim=1) * torch.tensor([1.0 + rank, 2.0])).sum().backward()
    opt.step()
    result(rank, case=f"sparse_embedding_dense{int(as_dense)}", weight=emb.weight.detach().tolist())

# no named_parameters: trains, and every rank ends equal
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 1), torch.nn.Conv2d(4, 1, 1))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1))
before = flat(model)
opt.zero_grad()
model(torch.rand([1, 1, 8, 8], generator=torch.Generator().manual_seed(rank))).sum().backward()
opt.step()
result(rank, case="no_named_parameters", params=flat(model), moved=flat(model) != before)


# each rank's loss uses a different head: unused parameters must not hang the exchange
class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(6, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc2(F.relu(self.fc1(x)))
        return h, self.fc3(F.relu(h))


torch.manual_seed(2)
model = Heads()
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for cls, kw in ((torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.Adam, dict(lr=0.01))):
    opt = wrap(cls(model.parameters(), **kw), named=model.named_parameters())
    out1, out2 = model(torch.ones(2, 6))
    opt.zero_grad()
    ((out1 if rank == 0 else out2) ** 2).sum().backward()
    opt.step()
result(rank, case="force_allreduce", params=flat(model))
