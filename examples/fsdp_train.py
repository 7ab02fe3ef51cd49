"""Train examples/pytorch_train.py's MLP on scikit-learn's digits with sharded data parallelism
(PyTorch FSDP) and hvdcompress's compressed reduce-scatter.

    torchrun --nproc_per_node 2 examples/fsdp_train.py --compression int8
    torchrun --nproc_per_node 2 examples/fsdp_train.py --compression onebit_ef --fsdp 1
    torchrun --nproc_per_node 2 examples/fsdp_train.py --params compressor=topk,k=0.05,ef=vanilla

``--fsdp 2`` (default): ``fully_shard`` on each Linear and on the model, then
``hvdcompress.torch.fsdp.compress(model, compression=...)``; ``--fsdp 1``:
``FullyShardedDataParallel`` (FULL_SHARD, one unit per Linear) with
``register_comm_hook(fsdp.CompressionState(...), fsdp.reduce_scatter_hook)``. ``--compression
dense``: FSDP's own reduce-scatter. Gloo on CPUs. Rank 0 prints each epoch's loss; every rank
reports test accuracy, mean step time and its gradient bytes over the run (dense vs sent) with
``hvdrun.write_result``.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
from compression_cli import parse_params  # examples/
from hvdrun import write_result
from pytorch_train import build_model, load_data, train_epochs

import hvdcompress
from hvdcompress.torch import fsdp

COMPRESSIONS = {
    "dense": None,
    "none": lambda: None,
    "fp16": hvdcompress.FP16,
    "bf16": hvdcompress.BF16,
    "int8": hvdcompress.Int8,
    "onebit_ef": lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()),
    "topk_ef": lambda: hvdcompress.ErrorFeedback(hvdcompress.TopK(0.05)),
}


def shard(net: torch.nn.Module, version: int, compression) -> tuple:
    """(the sharded model, the compression state or None for FSDP's own reduce-scatter)."""
    layers = [m for m in net if isinstance(m, torch.nn.Linear)]
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"),
                     sharding_strategy=ShardingStrategy.FULL_SHARD)
        if compression == "dense":
            return model, None
        state = fsdp.CompressionState(compression=compression)
        model.register_comm_hook(state, fsdp.reduce_scatter_hook)
        return model, state
    from torch.distributed.fsdp import fully_shard
    for layer in layers:
        fully_shard(layer)
    fully_shard(net)
    return net, None if compression == "dense" else fsdp.compress(net, compression=compression)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="int8")
    parser.add_argument("--params", default=None,
                        help="key=value,... for hvdcompress.from_params (overrides --compression)")
    parser.add_argument("--fsdp", type=int, choices=(1, 2), default=2)
    for flag, kind, default in (("--epochs", int, 10), ("--batch-size", int, 32), ("--lr", float, 0.05),
                                ("--hidden", int, 512), ("--seed", int, 42)):
        parser.add_argument(flag, type=kind, default=default)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(rank, size)
    if args.params:
        try:
            compression = hvdcompress.from_params(parse_params(args.params))
        except ValueError as error:
            parser.error(f"--params: {error}")
    else:
        compression = "dense" if args.compression == "dense" else COMPRESSIONS[args.compression]()
    model, state = shard(build_model(args.hidden), args.fsdp, compression)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps = len(x_tr) // args.batch_size

    def report(epoch: int, loss: torch.Tensor) -> None:
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}", flush=True)
    times = train_epochs(model, opt, x_tr, y_tr, args.epochs, args.batch_size,
                         torch.Generator().manual_seed(args.seed + rank), report)
    with torch.no_grad():
        accuracy = (model(x_te).argmax(1) == y_te).float().mean().item()
    counted = state.total_bytes if state is not None else None
    write_result(rank, {"compression": args.params or args.compression, "fsdp": args.fsdp, "accuracy": accuracy,
                        "step_ms": 1000 * float(np.mean(times[steps:] or times)),
                        "dense_bytes": counted and counted.dense, "sent_bytes": counted and counted.sent})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
