"""One torchrun rank of tests/test_hsdp.py: an MLP under FSDP2 HSDP, 2 replicas x 2 shards, one
record per case.

    torchrun --nproc_per_node 4 hsdp_worker.py --steps 6

Each case trains the same model on the same batches (rank r's own) for ``--steps`` steps and
records this rank's local parameter shards after every step, the bytes, and for ``topk_ef`` the
first layer's shard gradient as FSDP handed it over, the residual before and after, and the
averaged gradient (error feedback's conservation). ``dense_*``: FSDP's own HSDP, with the
sizes of its replicate all-reduce (``set_all_reduce_hook``). ``resume:*``: the state saved after
half the steps and loaded into a fresh model gives the bits of the run straight through;
``remesh:*``: a gathered checkpoint of the 2 x 2 mesh loaded at 1 x 4, 4 x 1, 1 x 2 and 2 x 1
(tests/fsdp/hsdp_remesh.py); ``in_node:*``: ``intra_node=``, FSDP's reduce-scatter compressed too
(tests/fsdp/hsdp_in_node.py). Then the refusal of FSDP1 HYBRID_SHARD, and last the replica check
on a perturbed replica.
"""
from __future__ import annotations

import argparse
import gc
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from hsdp_in_node import in_node  # noqa: E402
from hsdp_remesh import remesh  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
from hvdcompress.torch import fsdp  # noqa: E402

FROZEN = {"compressor": "onebit", "ef": "vanilla", "adam": "frozen", "freeze_steps": "2"}
#: case -> (compression or "dense", optimizer, check_replicas)
CASES = {
    "dense_sgd": ("dense", "sgd", None),
    "none_sgd": (None, "sgd", None),
    "dense_adamw": ("dense", "adamw", None),
    "none_adamw": (None, "adamw", None),
    "onebit_frozen": (FROZEN, "adamw", 1),
    "topk_ef": ({"compressor": "topk", "k": "0.05", "ef": "vanilla"}, "sgd", 1),
    "dgc": ({"compressor": "dgc", "sparsity": "0.95", "min_numel": "0"}, "sgd", 1),
    "onebit_ef": ({"compressor": "onebit", "ef": "vanilla"}, "sgd", None),
    "int8": ({"compressor": "int8"}, "sgd", None),
}
RESUME = {"frozen_gathered": (FROZEN, "adamw", True), "dgc_local": (CASES["dgc"][0], "sgd", False)}


def mlp() -> nn.Module:
    """Odd first dimensions: FSDP pads the last shard (63 rows at 2 shards: 32 and 31)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 63), nn.Tanh(), nn.Linear(63, 17), nn.Tanh(), nn.Linear(17, 5))


def batch(rank: int, step: int) -> tuple:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 24, generator=gen)
    return x, (x[:, :5] * 2).argmax(1)


def hsdp_model(mesh):
    net = mlp()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.01)


def build(mesh, compression, kind: str, check_replicas=None, prepare=None, intra_node=None):
    """(model, optimizer, state); ``prepare(model)`` runs before ``fsdp.compress`` (its hooks
    run before the state's); ``compression`` "dense": FSDP's own HSDP, no state; ``intra_node``:
    the in-node reduce-scatter's compressor (tests/fsdp/hsdp_in_node.py)."""
    model = hsdp_model(mesh)
    opt = optimizer(kind, model)
    if prepare is not None:
        prepare(model)
    state = None if compression == "dense" else fsdp.compress(model, compression=compression, optimizer=opt,
                                                              check_replicas=check_replicas, intra_node=intra_node)
    return model, opt, state


def shards(model) -> list:
    return [v for p in model.parameters() for v in p.to_local().detach().reshape(-1).tolist()]


def train(model, opt, rank: int, steps: range, after=None) -> list:
    out = []
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if after is not None:
            after()
        opt.step()
        out.append(shards(model))
    return out


class Conservation:
    """The first layer's weight shard, per step: the gradient FSDP handed over and the residual
    then (a hook registered before the state's), and after the backward pass the residual and
    the average."""

    def __init__(self):
        self.records: list = []
        self.model = self.state = None

    def prepare(self, model) -> None:
        self.model = model
        model[0].weight.register_post_accumulate_grad_hook(
            lambda p: self.records.append({"grad": p.grad.to_local().reshape(-1).tolist(),
                                           "residual_before": self.residual()}))

    def residual(self):
        entry = self.state.driver.states.get("0.weight", {}).get("residual")
        return None if entry is None else entry.reshape(-1).tolist()

    def after(self) -> None:
        self.records[-1].update(residual_after=self.residual(),
                                average=self.model[0].weight.grad.to_local().reshape(-1).tolist())


def dense_all_reduce_bytes(model) -> list:
    """FSDP's own replicate all-reduce, per call: the bytes of the flat shard it reduces."""
    from torch.distributed.fsdp import FSDPModule
    sizes: list = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_all_reduce_hook(lambda out: sizes.append(out.numel() * out.element_size()))
    return sizes


def refusal(mesh) -> str:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    model = FSDP(mlp(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh,
                 device_id=torch.device("cpu"))
    try:
        fsdp.compress(model, compression=hc.Int8())
    except ValueError as error:
        return str(error)
    return "no error"


OVERFLOW_AT = 3   # the amp_overflow case's step at which rank 1's loss is inf


def amp(mesh, rank: int, steps: range, overflow: bool) -> list:
    """CASES' topk_ef (SGD) with a GradScaler given to fsdp.compress (power-of-two scale: exact
    unscaling); with ``overflow`` rank 1's loss is inf at OVERFLOW_AT. Shards and scale per step."""
    model = hsdp_model(mesh)
    opt = optimizer("sgd", model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    fsdp.compress(model, compression=CASES["topk_ef"][0], optimizer=opt, scaler=scaler)
    out = []
    for step in steps:
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        if overflow and step == OVERFLOW_AT and rank == 1:
            loss = loss * float("inf")
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out.append({"shards": shards(model), "scale": scaler.get_scale()})
    return out


CLIP = 0.05


class Handed:
    """Every parameter's shard gradient as FSDP handed it over (a hook registered before the
    state's), and after the backward pass the averages: per step, name -> list."""

    def __init__(self):
        self.steps: list = []
        self.model = None

    def prepare(self, model) -> None:
        self.model = model
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(
                lambda p, name=name: self.steps[-1]["handed"].__setitem__(name, p.grad.to_local().reshape(-1).tolist()))

    def before(self) -> None:
        self.steps.append({"handed": {}})

    def after(self) -> None:
        self.steps[-1]["average"] = {n: p.grad.to_local().reshape(-1).tolist() for n, p in self.model.named_parameters()}


def clipped(mesh, rank: int, steps: range) -> dict:
    """clip_grad_norm=CLIP: NoCompression (clipped after the exchange) against FSDP's own HSDP with
    torch's clip_grad_norm_ on the DTensors; ErrorFeedback(NoCompression()) (a state: clipped
    before) with what FSDP handed over and the averages recorded."""
    out = {}
    model, opt, _ = build(mesh, "dense", "sgd")
    reference = []
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        reference.append(shards(model))
    out["reference"] = reference
    model = hsdp_model(mesh)
    opt = optimizer("sgd", model)
    fsdp.compress(model, compression=hc.NoCompression(), optimizer=opt, clip_grad_norm=CLIP)
    out["after"] = train(model, opt, rank, steps)
    handed = Handed()
    model = hsdp_model(mesh)
    opt = optimizer("sgd", model)
    handed.prepare(model)
    fsdp.compress(model, compression=hc.ErrorFeedback(hc.NoCompression()), optimizer=opt, clip_grad_norm=CLIP)
    for step in steps:
        x, y = batch(rank, step)
        handed.before()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        handed.after()
        opt.step()
    out["before"] = handed.steps
    return out


def lifetime(mesh, rank: int) -> dict:
    """The model alone keeps its state alive (``compress``'s result dropped, the steps still go
    through it) and the state, which holds the parameters, does not outlive the model."""
    model, opt, state = build(mesh, CASES["topk_ef"][0], "sgd")
    state_ref, model_ref = weakref.ref(state), weakref.ref(model)
    del state
    while gc.collect():
        pass
    train(model, opt, rank, range(2))
    steps = state_ref().total_bytes.steps if state_ref() is not None else None
    del model, opt
    while gc.collect():
        pass
    return {"steps_held_by_the_model": steps, "state_freed": state_ref() is None, "model_freed": model_ref() is None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    steps = range(args.steps)
    for case, (compression, kind, check) in CASES.items():
        watch = Conservation() if case == "topk_ef" else None
        model, opt, state = build(mesh, compression, kind, check, watch and watch.prepare)
        record: dict = {"case": case}
        if watch is not None:
            watch.state, record["conservation"] = state, watch.records
        if state is None:
            record["fsdp_all_reduce"] = dense_all_reduce_bytes(model)
        record["shards"] = train(model, opt, rank, steps, watch and watch.after)
        if state is not None:
            record["bytes"] = state.total_bytes.as_dict()
            record["cross_node"] = state.cross_node_bytes.as_dict()
        write_result(rank, record)
    half = range(args.steps // 2)
    for case, (compression, kind, gather) in RESUME.items():
        model, opt, state = build(mesh, compression, kind)
        straight = train(model, opt, rank, steps)[-1]
        model, opt, state = build(mesh, compression, kind)
        train(model, opt, rank, half)
        saved = ([p.to_local().detach().clone() for p in model.parameters()], opt.state_dict(),
                 state.state_dict(gather=gather))
        model, opt, state = build(mesh, compression, kind)
        with torch.no_grad():
            for p, v in zip(model.parameters(), saved[0]):
                p.to_local().copy_(v)
        opt.load_state_dict(saved[1])
        state.load_state_dict(saved[2])
        resumed = train(model, opt, rank, range(len(half), args.steps))[-1]
        write_result(rank, {"case": f"resume:{case}", "straight": straight, "resumed": resumed})
    worker = SimpleNamespace(build=build, train=train, hsdp_model=hsdp_model, optimizer=optimizer, FROZEN=FROZEN)
    for record in remesh(worker, mesh, rank, dist.get_world_size()):
        write_result(rank, record)
    for record in in_node(worker, mesh, rank, steps):
        write_result(rank, record)
    write_result(rank, {"case": "clip", **clipped(mesh, rank, steps)})
    for case, overflow in (("amp", False), ("amp_overflow", True)):
        write_result(rank, {"case": case, "steps": amp(mesh, rank, steps, overflow)})
    write_result(rank, {"case": "refusal", "message": refusal(mesh)})
    write_result(rank, {"case": "lifetime", **lifetime(mesh, rank)})
    model, opt, state = build(mesh, FROZEN, "adamw", 1)
    train(model, opt, rank, range(1))
    if rank >= 2:   # replica 1 drifts, on both shards: every replicate group sees it
        with torch.no_grad():
            model[0].weight.to_local()[0, 0] += 1e-3
    try:
        train(model, opt, rank, range(1, 2))
        message = "no error"
    except hc.ReplicaMismatch as error:
        message = str(error)
    write_result(rank, {"case": "replicas_differ", "message": message})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
