"""One torchrun rank of tests/test_fsdp.py: an MLP under FSDP1 (FullyShardedDataParallel with
reduce_scatter_hook) or FSDP2 (fully_shard with fsdp.compress), one record per case.

    torchrun --nproc_per_node 2 worker.py --cases fsdp1:int8,fsdp2:onebit_ef,... [--train] [--resume]

A reduce-scatter case records, for every call of every step, the unit, this rank's input flat
gradient and its output shard (the test recomputes every shard in numpy from every rank's
inputs). ``--train``: 40 steps of dense FSDP and of each compressor, the last losses and bytes.
``--resume``: the hook state saved after 2 of 4 steps and loaded into a fresh model and state
gives the parameters of the run straight through.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from hvdrun import write_result  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import hvdcompress as hc  # noqa: E402
from hvdcompress.torch import fsdp  # noqa: E402

BLOCK = 256
COMPRESSIONS = {
    "none": lambda: None,
    "fp16": hc.FP16,
    "int8": hc.Int8,
    "onebit_ef": lambda: hc.ErrorFeedback(hc.OneBit()),
    "topk_ef": lambda: hc.ErrorFeedback(hc.TopK(0.05)),
}
#: two-level cases (4 ranks, 2 per node): the node level's compressor, the cross level's (and all_gather=)
TWO_LEVEL = {"two_level_int8": (hc.NoCompression, hc.Int8), "two_level_onebit_ef": (hc.FP16, COMPRESSIONS["onebit_ef"]),
             "two_level_int8_ag": (hc.NoCompression, hc.Int8, hc.Int8)}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def batch(rank: int, step: int) -> tuple:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 32, generator=gen)
    return x, (x[:, :10] * 3).argmax(1)


def sharded(version: str, compression, bf16: bool = False, block: int = BLOCK):
    """(model, state) under FSDP1 or FSDP2; ``compression`` None and no state: dense FSDP."""
    net = mlp()
    dtype = torch.bfloat16 if bf16 else None
    if version == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=torch.device("cpu"),
                     sharding_strategy=ShardingStrategy.FULL_SHARD,
                     mixed_precision=MixedPrecision(reduce_dtype=dtype) if bf16 else None)
        state = None if compression == "dense" else fsdp.CompressionState(compression=compression, block=block)
        if state is not None:
            model.register_comm_hook(state, fsdp.reduce_scatter_hook)
        return model, state
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(reduce_dtype=dtype) if bf16 else MixedPrecisionPolicy()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    if isinstance(compression, tuple):   # two-level: (node level, cross level)
        gather = compression[2]() if len(compression) > 2 else None
        return net, fsdp.compress(net, compression=compression[1](), intra_node=compression[0](), ranks_per_node=2,
                                  block=block, all_gather=gather)
    state = None if compression == "dense" else fsdp.compress(net, compression=compression, block=block)
    return net, state


def record_calls(state) -> list:
    """Every reduce-scatter of ``state`` as (unit, input, output, scale), from now on."""
    calls = []
    inner = state.reduce_scatter

    def recording(name, grad, output, scale):
        given = grad.detach().float().reshape(-1).tolist()
        inner(name, grad, output, scale)
        calls.append({"unit": name, "input": given, "output": output.detach().float().reshape(-1).tolist(),
                      "scale": scale, "dtype": str(grad.dtype)})
    state.reduce_scatter = recording
    return calls


def train(model, steps: int, rank: int, start: int = 0, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(start, start + steps):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, opt


def full_params(model) -> list:
    """This rank's shards of the parameters, flat, in order."""
    out = []
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out += local.detach().reshape(-1).tolist()
    return out


OVERFLOW_AT = 3   # the --amp run's step at which rank 1's loss is inf


def amp_run(rank: int, scaled: bool, overflow: bool) -> dict:
    """FSDP2 with onebit + EF, SGD with momentum, 6 steps; with ``scaled`` a GradScaler (power-of-
    two scale: unscaling is exact) given to fsdp.compress; with ``overflow`` rank 1's loss is
    inf at OVERFLOW_AT. Every step's parameter shard, error-feedback checksum and scale."""
    net = mlp()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2) if scaled else None
    amp = {} if scaler is None else {"optimizer": opt, "scaler": scaler}
    state = fsdp.compress(net, compression=COMPRESSIONS["onebit_ef"](), block=BLOCK, **amp)
    steps = []
    for step in range(6):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(net(x), y)
        if overflow and step == OVERFLOW_AT and rank == 1:
            loss = loss * float("inf")
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        residual = sum(float(v.double().abs().sum()) for st in state.state_dict()["tensors"].values()
                       for k, v in st.items() if k.endswith("residual"))
        steps.append({"params": full_params(net), "residual": residual,
                      "scale": None if scaler is None else scaler.get_scale()})
    return {"steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--train", default="")
    parser.add_argument("--resume", default="")
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for case in filter(None, args.cases.split(",")):
        version, name = case.split(":")
        bf16 = name.endswith("_bf16")
        base = name.removesuffix("_bf16")
        model, state = sharded(version, TWO_LEVEL[base] if base in TWO_LEVEL else COMPRESSIONS[base](), bf16)
        calls = record_calls(state)
        train(model, 3, rank)
        nodes = {"cross": state.cross_node_bytes.as_dict(), "gathered": state.all_gather_bytes.as_dict()} \
            if base in TWO_LEVEL else {}
        write_result(rank, {"case": case, "calls": calls, "bytes": state.total_bytes.as_dict(), **nodes})
    for version in filter(None, args.train.split(",")):
        for name in ("dense", "int8", "onebit_ef", "topk_ef"):
            model, state = sharded(version, "dense" if name == "dense" else COMPRESSIONS[name]())
            losses, _ = train(model, 40, rank)
            write_result(rank, {"case": f"train:{version}:{name}", "losses": losses,
                                "bytes": None if state is None else state.total_bytes.as_dict()})
    for version in filter(None, args.resume.split(",")):
        model, state = sharded(version, COMPRESSIONS["topk_ef"]())
        train(model, 4, rank)
        straight = full_params(model)
        model, state = sharded(version, COMPRESSIONS["topk_ef"]())
        _, opt = train(model, 2, rank)
        saved = {"model": [p.detach().clone() for p in model.parameters()], "opt": opt.state_dict(),
                 "hook": state.state_dict()}
        model, state = sharded(version, COMPRESSIONS["topk_ef"]())
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with torch.no_grad():
            for p, v in zip(model.parameters(), saved["model"]):
                p.copy_(v)
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["hook"])
        train(model, 2, rank, start=2, opt=opt)
        write_result(rank, {"case": f"resume:{version}", "straight": straight, "resumed": full_params(model)})
    if args.amp:
        for label, scaled, overflow in (("plain", False, False), ("scaled", True, False), ("overflow", True, True)):
            write_result(rank, {"case": f"amp:{label}", **amp_run(rank, scaled, overflow)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
