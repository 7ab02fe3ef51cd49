"""Smoke worker for the netem launcher: a tiny model, a few Horovod allreduce steps.

Reports one record per rank (``common.result``) with the bytes its allreduces carried by
Horovod's accounting of a ring allreduce (2 (p-1)/p of the payload) and the bytes its ``eth0``
counters saw meanwhile.
"""
import argparse
from pathlib import Path

import horovod.torch as hvd
import torch
from common import result


def counter(name: str) -> int:
    return int(Path(f"/sys/class/net/eth0/statistics/{name}").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    payload = sum(p.numel() * p.element_size() for p in model.parameters())
    tx0 = counter("tx_bytes")
    for _ in range(args.steps):
        opt.zero_grad()
        loss = model(torch.randn(8, args.width)).square().mean()
        loss.backward()
        opt.step()
    sent = counter("tx_bytes") - tx0
    n = hvd.size()
    result(hvd.rank(), size=n, steps=args.steps,
           accounted=int(args.steps * payload * 2 * (n - 1) / n), wire_sent=sent,
           checksum=float(sum(p.detach().double().sum() for p in model.parameters())))


if __name__ == "__main__":
    main()
