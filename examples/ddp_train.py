"""Train examples/pytorch_train.py's MLP on scikit-learn's digits with PyTorch
DistributedDataParallel and hvdcompress's communication hook (no Horovod launcher needed).

    torchrun --nproc_per_node 2 examples/ddp_train.py --compression dgc
    torchrun --nproc_per_node 2 examples/ddp_train.py --params compressor=onebit,ef=vanilla,momentum=plain
    torchrun --nproc_per_node 4 examples/ddp_train.py --compression dgc --intra-node none --ranks-per-node 2
    torchrun --nproc_per_node 2 examples/ddp_train.py --optimizer adamw --lr 2e-3 \
        --params compressor=topk,k=0.01,ef=vanilla,adam=frozen,freeze_steps=100

The flags are pytorch_train.py's (examples/compression_cli.py), plus ``--optimizer``. The hook
is given the optimizer, so DGC (and ``momentum=...`` from ``--params``) take SGD's momentum
over, and ``adam=frozen`` AdamW's step. Gloo on CPUs,
NCCL when CUDA is available. Rank 0 prints the loss of each epoch; at the end every rank reports test accuracy, mean step time and
the gradient bytes of its last step (dense vs sent) with ``hvdrun.write_result``.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
from compression_cli import (  # examples/
    add_compression_arguments,
    add_intra_node_arguments,
    compression_from_args,
    intra_node_from_args,
)
from hvdrun import compression_figures, figures_text, write_result
from pytorch_train import build_model, load_data, train_epochs
from torch.nn.parallel import DistributedDataParallel as DDP

from hvdcompress import SparsityScheduler
from hvdcompress.torch import ddp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_compression_arguments(parser)
    add_intra_node_arguments(parser)
    for flag, kind, default in (("--epochs", int, 20), ("--batch-size", int, 32), ("--lr", float, 0.05),
                                ("--hidden", int, 2048), ("--seed", int, 42)):   # pytorch_train.py's
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="SGD with momentum 0.9, or AdamW (pass a smaller --lr, e.g. 2e-3)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)   # the same initial model on every rank (DDP broadcasts rank 0's)
    x_tr, y_tr, x_te, y_te = (t.to(device) for t in load_data(rank, size))
    net = build_model(args.hidden).to(device)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9) if args.optimizer == "sgd" \
        else torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = ddp.CompressionState(compression=compression_from_args(parser, args), optimizer=opt,
                                 named_parameters=net.named_parameters(),
                                 intra_node=intra_node_from_args(args), ranks_per_node=args.ranks_per_node,
                                 fusion=args.fusion)
    model.register_comm_hook(state, ddp.compression_hook)
    warmup = SparsityScheduler(state.compressor)

    steps = len(x_tr) // args.batch_size

    def report(epoch: int, loss: torch.Tensor) -> None:
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}"
                  f"{figures_text(compression_figures(state.total_bytes, warmup.get_sparsity()))}",
                  flush=True)
        warmup.step()
    times = train_epochs(model, opt, x_tr, y_tr, args.epochs, args.batch_size,
                         torch.Generator().manual_seed(args.seed + rank), report)
    with torch.no_grad():
        accuracy = (net(x_te).argmax(1) == y_te).float().mean().item()
    checksum = float(sum(p.detach().double().sum() for p in net.parameters()))
    write_result(rank, {"compression": args.compression, "accuracy": accuracy,
                        "step_ms": 1000 * float(np.mean(times[steps:] or times)),
                        "dense_bytes": state.last_step_bytes.dense,
                        "sent_bytes": state.last_step_bytes.sent, "param_checksum": checksum})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
