"""What ``check_replicas=N`` costs (issue 19): the torch optimizer's step time with the guard off
and at N, side by side in the same processes, plus the cost of one check on its own.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/replica_check.py --every 100

Model: the demo's MLP (64 -> hidden -> hidden -> 10, 4.3M parameters at hidden 2048) on random
batches, SGD with momentum, compression from ``--compression`` (default int8). Runs alternate
between the guard off and on in blocks of ``--every`` steps (so each "on" block holds exactly one
check), ``--blocks`` blocks each; rank 0 prints one ``RESULT {json}`` with the median step time
of each, their ratio, and the median time of one check (checksums and allgather) timed alone,
whose share of N steps is the guard's overhead by construction. A step is forward, backward,
exchange and update.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch

import hvdcompress.torch as hvc


def build(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def block(model, opt, steps: int, gen: torch.Generator) -> list:
    times = []
    for _ in range(steps):
        x, y = torch.randn(64, 64, generator=gen), torch.randint(0, 10, (64,), generator=gen)
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=100, help="check_replicas N (default 100)")
    ap.add_argument("--blocks", type=int, default=3, help="blocks of N steps per setting (default 3)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--compression", default="int8", help="a registered compressor name")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(hvd.rank())
    runs = {}
    for every in (None, args.every):
        model = build(args.hidden)
        opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                       named_parameters=model.named_parameters(),
                                       compression={"compressor": args.compression}, check_replicas=every)
        runs[every] = (model, opt, [])
        block(model, opt, 5, gen)  # warm-up (the guard's count is offset: still one check a block)
    for _ in range(args.blocks):
        for every, (model, opt, times) in runs.items():
            times.extend(block(model, opt, args.every, gen))
    _, opt, _ = runs[args.every]
    checks = []
    for _ in range(10):
        start = time.perf_counter()
        guard = opt._driver._replicas   # built at the first step
        guard.every, guard.steps = 1, 0
        opt._driver.check_replicas(lambda: [(opt._parameter_names[p], p) for p in opt._by_name])
        checks.append(time.perf_counter() - start)
    off, on = (statistics.median(runs[k][2]) for k in (None, args.every))
    mean_off, mean_on = (statistics.fmean(runs[k][2]) for k in (None, args.every))
    check = statistics.median(checks)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({
            "ranks": hvd.size(), "every": args.every, "compression": args.compression,
            "parameters": sum(p.numel() for p in model.parameters()),
            "step_ms_off": round(1e3 * off, 2), "step_ms_on": round(1e3 * on, 2),
            "mean_ratio_on_off": round(mean_on / mean_off, 4),
            "check_ms": round(1e3 * check, 2),
            "overhead_pct": round(100 * check / (args.every * off), 3)}), flush=True)


if __name__ == "__main__":
    main()
