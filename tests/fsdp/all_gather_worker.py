"""One torchrun rank of tests/test_fsdp_all_gather.py: tests/fsdp/worker.py's MLP under FSDP2
with ``fsdp.compress(..., all_gather=Int8(chunk=CHUNK))``, every case in one launch.

    torchrun --nproc_per_node 2 all_gather_worker.py

``gather``: 2 steps of plain SGD; per step, this rank's local shards and gradients before the
step, the shards after it, and the full weight and bias each Linear saw in its forward.
``train:dense`` / ``train:int8``: 40 steps of dense FSDP and of int8 reduce-scatter with int8
all-gather, losses and bytes. ``refusals``: the messages of FSDP1 and HSDP with ``all_gather=``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from worker import batch, mlp, sharded, train, write_result

import hvdcompress as hc
from hvdcompress.torch import fsdp

CHUNK = 64
LR = 0.05


def gathered(all_gather=None, compression=None):
    """The MLP under FSDP2 with ``all_gather`` and ``compression``; its state."""
    net = mlp()
    from torch.distributed.fsdp import fully_shard
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    return net, fsdp.compress(net, compression=compression, all_gather=all_gather)


def local(p) -> list:
    return p.to_local().detach().reshape(-1).tolist()


def gather_case(rank: int) -> dict:
    """Forward weights, shards, gradients and stepped shards of 2 SGD steps (module doc)."""
    model, state = gathered(hc.Int8(chunk=CHUNK))
    layers = [m for m in model if isinstance(m, nn.Linear)]
    seen: list = []
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, _, i=i: seen.append(
            (i, m.weight.detach().reshape(-1).tolist(), m.bias.detach().reshape(-1).tolist())))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    for step in range(2):
        seen.clear()
        shards = [[local(m.weight), local(m.bias)] for m in layers]
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        grads = [[m.weight.grad.to_local().reshape(-1).tolist(), m.bias.grad.to_local().reshape(-1).tolist()]
                 for m in layers]
        opt.step()
        steps.append({"shards": shards, "grads": grads, "forward": list(seen),
                      "after": [[local(m.weight), local(m.bias)] for m in layers]})
    return {"case": "gather", "steps": steps, "shapes": [list(m.weight.shape) for m in layers]}


def refusals() -> dict:
    """The ValueErrors of ``all_gather=`` under FSDP1 and under HSDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    messages = {}
    builders = {"fsdp1": lambda: FullyShardedDataParallel(mlp(), device_id=torch.device("cpu"))}

    def hsdp():
        net = mlp()
        mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(net, mesh=mesh)
    builders["hsdp"] = hsdp
    for name, build in builders.items():
        try:
            fsdp.compress(build(), compression=hc.Int8(), all_gather=hc.Int8())
            messages[name] = None
        except ValueError as e:
            messages[name] = str(e)
    return {"case": "refusals", "messages": messages}


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    write_result(rank, gather_case(rank))
    for name in ("dense", "int8"):
        model, state = sharded("fsdp2", "dense") if name == "dense" else gathered(hc.Int8(chunk=CHUNK), hc.Int8())
        losses, _ = train(model, 40, rank)
        write_result(rank, {"case": f"train:{name}", "losses": losses, "bytes": None if state is None else {
            "total": state.total_bytes.as_dict(), "all_gather": state.all_gather_bytes.as_dict(),
            "gradients": state.driver.total_bytes.as_dict()}})
    write_result(rank, refusals())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
