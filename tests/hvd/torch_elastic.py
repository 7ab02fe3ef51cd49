"""Compression under ``hvd.elastic.run``: 2 ranks, grown to 3, shrunk to 2 (tests/test_elastic.py).

    torch_elastic.py DIR          (DIR: where the states are written; the hosts file is
                                   $HVDCOMPRESS_HOSTS, read by elastic_discovery.sh)

Every batch is one step of onebit with error feedback and Nesterov momentum (collective
'auto': the allgather at 2 ranks, the compressed allreduce of the large tensor at 3), with
the replica guard on every step, then a commit. :func:`world_wanted` says how many ranks each
batch should run on; while the world differs, rank 0 writes the hosts file and every rank
waits at ``check_host_updates`` (at most WAIT_S) until Horovod resets. On entering ``train``
after a reset every rank writes its compressor state (DIR/b<batch>.new.rank<r>.npz) and rank
0 the last commit's gathered states of the old ranks (DIR/b<batch>.old.rank<r>.npz).
Records: one per rank and batch (world, a digest of the parameters, the large tensor's
collective), and one per entry after a reset."""
import hashlib
import sys
import time

import horovod.torch as hvd
import torch
from common import dump_stacks_before_kill, result, save_reset_states, wait_for_world

import hvdcompress
import hvdcompress.torch as hvc
from hvdcompress.torch.elastic import TorchState

BATCHES = 16
WAIT_S = 120.0
OUT = sys.argv[1]


def world_wanted(batch: int) -> int:
    return 2 if batch < 5 else 3 if batch < 10 else 2


hvd.init()
dump_stacks_before_kill()
torch.set_num_threads(1)
torch.manual_seed(1)  # every rank the same; a joining rank gets rank 0's parameters in sync()
model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 4))
opt = hvc.DistributedOptimizer(  # before any other collective: see hvdcompress.torch.elastic
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    named_parameters=model.named_parameters(), check_replicas=1,
    compression=hvdcompress.from_params({"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}))
state = TorchState(model=model, optimizer=opt, batch=0)


def digest() -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]


@hvd.elastic.run
def train(state):
    rank, world = hvd.rank(), hvd.size()
    if state.batch:
        saved = state._handlers["optimizer"]._saved["hvdcompress"]
        save_reset_states(OUT, state.batch, rank, opt._tensor_state, saved["ranks"])
        result(rank, event="entry", batch=state.batch, world=world, old_world=len(saved["ranks"]))
    waited = time.monotonic()
    while state.batch < BATCHES:
        if world_wanted(state.batch) != world:
            wait_for_world(state, state.batch, rank, world, world_wanted(state.batch), waited, WAIT_S)
            continue
        gen = torch.Generator().manual_seed(1000 * state.batch + rank)
        opt.zero_grad()
        x, y = torch.randn(8, 20, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        state.batch += 1
        result(rank, event="step", batch=state.batch, world=world, digest=digest(),
               collective=opt._exchange.plan["0.weight"][1])
        state.commit()
        waited = time.monotonic()


train(state)
