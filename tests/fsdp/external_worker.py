"""One torchrun rank of tests/test_external_compressor.py: tests/external_compressor.py's HalfTopK
(defined outside the package), built by name with from_params, under the DDP hook, FSDP1 and
FSDP2 in one launch (Gloo, CPU). One record per case:

* "ddp:exact": w = 0, loss = sum(w * c_r) (grad = c_r, the numpy draw of
  tests/hvd/torch_common.rank_vector), SGD lr=1, one step: the averaged gradient and w;
* "ddp:ef": the same with error feedback, 3 steps of c_{r,s} (seed 200 + 10 s): w after each;
* "ddp:train", "fsdp1:train", "fsdp2:train": tests/fsdp/worker.py's MLP, top-k + EF, 30 steps on
  a fixed batch per rank (SGD lr=0.1, momentum 0.9): the losses and the sha256 of the full parameters
  (gathered on every rank under FSDP);
* "fsdp1:exact", "fsdp2:exact": one step of top-k without EF, blocks of 256: every reduce-scatter
  call's unit, this rank's flat input, its output shard and scale (the test recomputes each shard);
* "fsdp2:refused": fsdp.compress on a fully_shard model with the same algorithm not declaring
  fixed_size_payload: the ValueError's message (None if it was accepted).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the external compressor
import external_compressor  # noqa: E402
from worker import batch, mlp, record_calls, sharded, write_result  # noqa: E402  tests/fsdp/worker.py

import hvdcompress  # noqa: E402
from hvdcompress.torch import ddp, fsdp  # noqa: E402

N = 1000
BLOCK = 256
TOPK = {"compressor": external_compressor.NAME, "k": "0.05"}
TOPK_EF = {**TOPK, "ef": "vanilla"}


class Linear(nn.Module):
    """``loss = sum(w * c)``: the gradient of ``w`` is exactly ``c``."""

    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def rank_vector(rank: int, n: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32))


def with_hook(net: nn.Module, spec: dict) -> DDP:
    model = DDP(net)
    model.register_comm_hook(ddp.CompressionState(compression=hvdcompress.from_params(spec),
                                                  named_parameters=net.named_parameters()),
                             ddp.compression_hook)
    return model


def ddp_linear(rank: int, spec: dict, seeds: list) -> tuple:
    net = Linear(N)
    model = with_hook(net, spec)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ws, grads = [], []
    for seed in seeds:
        opt.zero_grad()
        model(rank_vector(rank, N, seed)).backward()
        opt.step()
        grads.append(net.w.grad.tolist())
        ws.append(net.w.detach().tolist())
    return ws, grads


def train(model: nn.Module, steps: int, rank: int) -> list:
    """``steps`` steps of SGD (lr=0.1, momentum 0.9) on this rank's fixed batch; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(rank, 0)
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def full_sha(version: str, model: nn.Module) -> str:
    """The sha256 of the full parameters (under FSDP gathered: a collective on every rank)."""
    if version == "fsdp1":
        tensors = list(model.state_dict().values())      # FULL_STATE_DICT on every rank
    elif version == "fsdp2":
        tensors = [p.full_tensor() for p in model.parameters()]
    else:
        tensors = list(model.parameters())
    return hashlib.sha256(b"".join(t.detach().float().contiguous().numpy().tobytes() for t in tensors)).hexdigest()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    ws, grads = ddp_linear(rank, TOPK, [100])
    write_result(rank, {"case": "ddp:exact", "w": ws[0], "grad": grads[0]})
    ws, _ = ddp_linear(rank, TOPK_EF, [200 + 10 * s for s in range(3)])
    write_result(rank, {"case": "ddp:ef", "ws": ws})

    model = with_hook(mlp(), TOPK_EF)
    losses = train(model, 30, rank)
    write_result(rank, {"case": "ddp:train", "losses": losses, "params": full_sha("ddp", model)})

    for version in ("fsdp1", "fsdp2"):
        model, state = sharded(version, hvdcompress.from_params(TOPK), block=BLOCK)
        calls = record_calls(state)
        train(model, 1, rank)
        write_result(rank, {"case": f"{version}:exact", "calls": calls,
                            "compressor": type(state.compressor.unwrap()).__name__})
        model, state = sharded(version, hvdcompress.from_params(TOPK_EF), block=BLOCK)
        losses = train(model, 30, rank)
        write_result(rank, {"case": f"{version}:train", "losses": losses, "params": full_sha(version, model),
                            "bytes": state.total_bytes.as_dict()})

    net = mlp()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    try:
        fsdp.compress(net, compression=external_compressor.VariableHalfTopK(0.05))
        refused = None
    except ValueError as e:
        refused = str(e)
    write_result(rank, {"case": "fsdp2:refused", "error": refused})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
