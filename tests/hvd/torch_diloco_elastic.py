"""DiLoCo under ``hvd.elastic.run``: 2 sites, grown to 3 at a sync, shrunk to 2 at a later one
(tests/test_diloco_elastic.py).

    torch_diloco_elastic.py DIR   (DIR: where the states are written; the hosts file is
                                   $HVDCOMPRESS_HOSTS, read by elastic_discovery.sh)

Every batch is one inner AdamW step on the site's own data; every H batches the outer sync
(top-k 10% with error feedback, check_replicas=1) and a commit. :func:`world_wanted` changes
only at multiples of H: while the world differs, rank 0 writes the hosts file and every rank
waits at ``check_host_updates`` (at most WAIT_S) until Horovod resets. On entering ``train``
after a reset every rank writes its error feedback (DIR/b<batch>.new.rank<r>.npz) and rank 0
the last commit's gathered residuals of the old sites (DIR/b<batch>.old.rank<r>.npz).
Records: one per rank and sync (world, digests of the parameters and of the inner AdamW state),
and one per entry after a reset (the inner state's digest then)."""
import hashlib
import sys
import time

import horovod.torch as hvd
import torch
from common import dump_stacks_before_kill, result, save_reset_states, wait_for_world

import hvdcompress.torch as hvc
from hvdcompress.torch.elastic import TorchState

H, BATCHES = 3, 15
WAIT_S = 120.0
OUT = sys.argv[1]


def world_wanted(batch: int) -> int:
    return 2 if batch < 6 else 3 if batch < 12 else 2


hvd.init()
dump_stacks_before_kill()
torch.set_num_threads(1)
torch.manual_seed(1)  # a joining site gets rank 0's parameters in sync()
model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 4))
opt = hvc.DiLoCo(  # before any other collective: see hvdcompress.torch.elastic
    torch.optim.AdamW(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
    sync_every=H, compression={"compressor": "topk", "k": 0.1, "ef": "vanilla"}, check_replicas=1)
state = TorchState(model=model, optimizer=opt, batch=0)


def digest(tensors) -> str:
    return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in tensors)).hexdigest()[:16]


def inner_digest() -> str:
    st = opt.inner.state
    return digest([st[p][k] for p in model.parameters() if p in st for k in ("exp_avg", "exp_avg_sq")])


@hvd.elastic.run
def train(state):
    rank, world = hvd.rank(), hvd.size()
    if state.batch:
        saved = state._handlers["optimizer"]._saved["hvdcompress"]
        save_reset_states(OUT, state.batch, rank, {n: {k: v for k, v in st.items() if torch.is_tensor(v)}
                                                   for n, st in opt._driver.states.named().items()},
                          saved["ranks"])
        result(rank, event="entry", batch=state.batch, world=world, old_world=len(saved["ranks"]),
               inner=inner_digest(), steps=opt.steps)
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
        if opt.synced:
            result(rank, event="sync", batch=state.batch, world=world, digest=digest(model.parameters()),
                   inner=inner_digest())
            state.commit()
            waited = time.monotonic()


train(state)
