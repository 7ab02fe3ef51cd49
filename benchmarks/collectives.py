"""Bytes each rank puts on its link per step, by compressor and collective, at P = 2 ... 64.

Payload sizes are measured by compressing a real tensor (every registered compressor, with its
defaults or the arguments below) the way the exchange engine does: the whole tensor for
allreduce/allgather, P segments for the compressed allreduce (alltoall). Wire bytes come from
the cost model of :mod:`hvdcompress.transport.collectives` (ring algorithms): allreduce and alltoall
2(P-1)/P · payload, allgather (P-1) · payload. Multi-round algorithms (PowerSGD, CSC) count every
round. Writes benchmarks/results/collectives.json and prints a table (ratio = dense / method).

    .venv/bin/python benchmarks/collectives.py [--numel 4194304] [--ranks 2,4,8,16,32,64]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hvdcompress as hc
from hvdcompress.contract.compressor import TensorInfo, payload_bytes
from hvdcompress.ops.torch_ops import TorchOps
from hvdcompress.transport.collectives import choose_collective, wire_bytes

OPS = TorchOps()
RESULTS = Path(__file__).parent / "results"
SPECS = {
    "onebit+ef": {"compressor": "onebit", "ef": "vanilla"}, "efsignsgd": {"compressor": "efsignsgd"},
    "twobit": {"compressor": "twobit"}, "int8": {"compressor": "int8"},
    "qsgd": {"compressor": "qsgd"}, "terngrad": {"compressor": "terngrad"},
    "natural": {"compressor": "natural"}, "bf16": {"compressor": "bf16"},
    "fp16": {"compressor": "fp16"}, "randomk 1%": {"compressor": "randomk", "k": "0.01"},
    "powersgd r4": {"compressor": "powersgd", "rank": "4"},
    "csc 1%": {"compressor": "csc", "ratio": "0.01"},
    "dgc 0.999": {"compressor": "dgc", "sparsity": "0.999"},
    "topk 1%": {"compressor": "topk", "k": "0.01", "ef": "vanilla"},
}


def rounds_bytes(compressor, x: torch.Tensor, name: str, world: int) -> tuple:
    """(bytes of every round's payload, whether they are summed) for one rank compressing x."""
    info = TensorInfo(name=name, numel=x.numel(), world=world, shape=tuple(x.shape), rank=0,
                      param=torch.zeros_like(x).view(-1))
    state: dict = {}
    compressor.init_state(OPS, x.view(-1), state, info)
    packet = compressor.compress(OPS, x.view(-1), state, info)
    total, summable = payload_bytes(OPS, packet.tensors), packet.summable
    while packet.resume is not None:  # later rounds: what came back is this rank's own payload
        packet = packet.resume([t * world for t in packet.tensors])
        total += payload_bytes(OPS, packet.tensors)
    return total, summable


def wire_per_rank(spec: dict, x: torch.Tensor, world: int) -> tuple:
    compressor = hc.from_params(spec)
    collective = choose_collective("auto", compressor, world)
    payload, summable = rounds_bytes(compressor, x, "w", world)
    if summable:
        return "allreduce", wire_bytes("allreduce", payload, world), wire_bytes("allreduce", payload, world)
    gather = wire_bytes("allgather", payload, world)
    if collective != "alltoall":
        return collective, gather, gather
    length = -(-x.numel() // world)
    segments = sum(rounds_bytes(compressor, torch.zeros(length).normal_(), f"w#seg{j}", world)[0]
                   for j in range(world))
    # alltoall of the P segments, then the all-gather of one re-compressed segment per rank
    wire = (world - 1) / world * segments + (world - 1) * segments / world
    return "alltoall", gather, wire


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=4 * 1024 * 1024, help="a multiple of 1024")
    ap.add_argument("--ranks", default="2,4,8,16,32,64")
    args = ap.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    torch.manual_seed(0)
    x = torch.randn(1024, args.numel // 1024)  # a weight matrix (PowerSGD factors matrices)
    rows = []
    for label, spec in SPECS.items():
        for world in ranks:
            collective, gather, chosen = wire_per_rank(spec, x, world)
            dense = wire_bytes("allreduce", 4 * args.numel, world)
            rows.append({"method": label, "ranks": world, "auto": collective, "allgather_bytes": gather,
                         "chosen_bytes": chosen, "dense_bytes": dense})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "collectives.json").write_text(json.dumps({"numel": args.numel, "rows": rows}, indent=1))
    print(f"dense / method, bytes per rank per step, {args.numel} float32 elements "
          "(auto's choice; allgather in brackets where auto picked something else)")
    print("| method | auto at 64 | " + " | ".join(f"P={p}" for p in ranks) + " |")
    print("|---|---|" + "---|" * len(ranks))
    for label in SPECS:
        cells, auto = [], ""
        for row in (r for r in rows if r["method"] == label):
            cell = f"{row['dense_bytes'] / row['chosen_bytes']:.1f}x"
            if row["allgather_bytes"] != row["chosen_bytes"]:
                cell += f" ({row['dense_bytes'] / row['allgather_bytes']:.1f}x)"
            cells.append(cell)
            auto = row["auto"]
        print(f"| {label} | {auto} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
