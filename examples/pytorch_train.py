"""Train an MLP on scikit-learn's digits with Horovod and hvdcompress.

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_train.py --compression dgc
    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_train.py \
        --params compressor=onebit,ef=vanilla,momentum=plain

``--params`` takes any compressor of the registry with its options, BytePS style (key=value,
comma-separated; see ``hvdcompress.available()`` and ``hvdcompress.from_params``), e.g.
``compressor=powersgd,rank=4`` or ``compressor=int8,chunk=1024``. ``--intra-node fp16`` adds
two-level compression (fp16 inside each node, the compressor only between nodes;
``--ranks-per-node 2`` emulates 2-rank nodes on one machine); ``--fusion 4194304`` compresses
consecutive tensors up to 4 MiB as one buffer (fused compression). The data ships inside scikit-learn (no download). Each rank trains on its own shard; rank 0
prints a progress bar; at the end every rank reports test accuracy, mean step time and the
gradient bytes of one step after warm-up (dense vs sent by this rank) with
``hvdrun.write_result``: a ``RESULT {json}`` line on stdout when run by hand as above,
a record in its rank's file under ``hvdrun.run_script`` (``examples/demo.py``).
"""
from __future__ import annotations

import argparse
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from compression_cli import (  # examples/
    add_compression_arguments,
    add_intra_node_arguments,
    compression_from_args,
    init_horovod,
    intra_node_from_args,
)
from hvdrun import compression_figures, progress, write_result
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdcompress.torch as hvc


def load_data(rank: int, size: int):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                              stratify=digits.target)
    shard = slice(rank, None, size)
    return (torch.from_numpy(x_tr[shard]), torch.from_numpy(y_tr[shard]).long(),
            torch.from_numpy(x_te), torch.from_numpy(y_te).long())


def build_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> tuple:
    """One training step on ``(x, y)``: ``(loss, seconds)``."""
    start = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss, time.perf_counter() - start


def train_epochs(model: torch.nn.Module, opt: torch.optim.Optimizer, x_tr: torch.Tensor, y_tr: torch.Tensor,
                 epochs: int, batch_size: int, gen: torch.Generator, on_epoch) -> list:
    """``epochs`` passes over shuffled batches of ``(x_tr, y_tr)``, ``on_epoch(epoch, loss)``
    after each; the step times."""
    steps = len(x_tr) // batch_size
    times = []
    for epoch in range(epochs):
        for idx in torch.randperm(len(x_tr), generator=gen)[:steps * batch_size].view(steps, -1):
            loss, seconds = train_step(model, opt, x_tr[idx], y_tr[idx])
            times.append(seconds)
        on_epoch(epoch, loss)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_compression_arguments(parser)
    add_intra_node_arguments(parser)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    init_horovod(hvd, args)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(hvd.rank(), hvd.size())
    model = build_model(args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = compression_from_args(parser, args)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, intra_node=intra_node_from_args(args),
                                   ranks_per_node=args.ranks_per_node, fusion=args.fusion)
    warmup = hvc.SparsityScheduler(opt)
    steps_per_epoch = len(x_tr) // args.batch_size
    bar = progress(args.epochs * steps_per_epoch, disable=hvd.rank() != 0,
                   desc=f"{args.compression:>6}", ncols=90)
    step_times = []
    gen = torch.Generator().manual_seed(args.seed + hvd.rank())
    for _ in range(args.epochs):
        order = torch.randperm(len(x_tr), generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss, seconds = train_step(model, opt, x_tr[idx], y_tr[idx])
            step_times.append(seconds)
            bar.set_postfix(loss=f"{loss.item():.3f}",
                            **compression_figures(opt.total_bytes, warmup.get_sparsity()))
            bar.update()
        warmup.step()
    bar.close()
    with torch.no_grad():
        accuracy = (model(x_te).argmax(1) == y_te).float().mean().item()
    params = torch.cat([p.detach().view(-1) for p in model.parameters()])
    summary = {"compression": args.compression, "rank": hvd.rank(), "accuracy": accuracy,
               "step_ms": 1000 * float(np.mean(step_times[steps_per_epoch:])),
               "dense_bytes": opt.last_step_bytes.dense, "sent_bytes": opt.last_step_bytes.sent,
               "param_checksum": float(params.double().sum())}
    write_result(hvd.rank(), summary)


if __name__ == "__main__":
    main()
