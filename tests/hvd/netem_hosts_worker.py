"""Worker for tests/test_netem_hosts.py, launched by benchmarks.netem on emulated hosts x slots.

Reports one record per rank: Horovod's placement (rank, size, local rank / size, cross rank /
size), the address this rank's hostname resolves to in its namespace, then

* ``exact``: w after ``STEPS`` SGD steps (lr 1, from 0) on loss = sum(w * g_r) with the
  integer-valued gradients of :func:`gradient`, two-level with ``intra_node=NoCompression()``
  and ranks per node from Horovod (local_size): sums of integers / P are exact in float32, so
  the test compares bit for bit with its numpy reference;
* ``checksum``: a tiny MLP after a few steps of two-level DGC(0.99) with ``intra_node=FP16()``
  (identical on every rank or the exchange diverged);
* ``lo_bytes`` / ``eth0_bytes``: what the namespace's loopback and link carried during the
  two-level runs (shared by the ranks of one host).
"""
import socket
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
from common import result

import hvdcompress as hc
import hvdcompress.torch as hvc

N, STEPS, WIDTH = 1000, 3, 64


def gradient(rank: int, step: int, n: int = N) -> np.ndarray:
    """Rank ``rank``'s integer-valued float32 gradient at ``step`` (the test's reference too)."""
    return ((np.arange(n) * (rank + 1) + 3 * step) % 7 - 3).astype(np.float32)


def counter(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/statistics/tx_bytes").read_text())


def main() -> None:
    hvd.init(process_sets=hvc.node_process_sets())
    rank = hvd.rank()
    lo0, eth0 = counter("lo"), counter("eth0")

    w = torch.nn.Parameter(torch.zeros(N))
    opt = hvc.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   compression=hc.NoCompression(), intra_node=hc.NoCompression())
    for step in range(STEPS):
        opt.zero_grad()
        (w * torch.from_numpy(gradient(rank, step))).sum().backward()
        opt.step()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, 10))
    dgc = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hc.DGC(0.99, min_numel=0), intra_node=hc.FP16())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(rank)
    for _ in range(STEPS):
        dgc.zero_grad()
        model(torch.randn(8, WIDTH)).square().mean().backward()
        dgc.step()
    hvd.allreduce(torch.zeros(1), name="done")  # every rank's traffic is in the counters
    result(rank, size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
           cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(),
           address=socket.gethostbyname(socket.gethostname()),
           exact=w.detach().numpy().tolist(),
           checksum=[float(p.detach().double().sum()) for p in model.parameters()],
           lo_bytes=counter("lo") - lo0, eth0_bytes=counter("eth0") - eth0)


if __name__ == "__main__":
    main()
