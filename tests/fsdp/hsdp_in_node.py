"""tests/fsdp/hsdp_worker.py's in-node cases: ``fsdp.compress(..., intra_node=...)`` under HSDP, FSDP's
reduce-scatter over the shard dimension compressed as well (hvdcompress/torch/hsdp_in_node.py).

* ``in_node:none_sgd`` / ``in_node:none_frozen``: a lossless in-node compressor ({"compressor": "none"},
  NoCompression()) with the worker's ``none_sgd`` / ``onebit_frozen`` across nodes (the test
  compares them bit for bit);
* ``in_node:int8_frozen``: Int8() inside the node, onebit + EF + FrozenAdam across (replica check
  every step), ``in_node:bf16_int8``: {"compressor": "bf16"} inside, int8 across; shards and bytes;
* ``in_node:resume_gathered`` / ``in_node:resume_local``: int8 + EF inside (a residual per rank),
  FrozenAdam across, saved after half the steps and loaded into a fresh model;
* ``in_node:refusals``: the compressors and options ``intra_node=`` refuses at compress() time (and
  FSDP left as it was), and the checkpoints its state refuses (nothing changed).
"""
from __future__ import annotations

import copy

import torch

import hvdcompress as hc
from hvdcompress.torch import fsdp

INT8_EF = {"compressor": "int8", "ef": "vanilla"}


def record_bytes(state) -> dict:
    return {"bytes": state.total_bytes.as_dict(), "cross_node": state.cross_node_bytes.as_dict(),
            "in_node": state.in_node_bytes.as_dict(), "last_step": state.last_step_bytes.as_dict()}


def residuals(in_node_state: dict) -> dict:
    """{unit: {key: list}} of the in-node state's residual entries (one rank's ``'tensors'``)."""
    return {u: {k: v.reshape(-1).tolist() for k, v in st.items() if k.endswith("residual")}
            for u, st in in_node_state["tensors"].items()}


def flat(value):
    """``value`` with its tensors as lists (for an exact comparison)."""
    if torch.is_tensor(value):
        return value.reshape(-1).tolist()
    if isinstance(value, dict):
        return {k: flat(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [flat(v) for v in value]
    return value


def trained(w, mesh, rank, steps, compression, kind, intra, check=None) -> dict:
    model, opt, state = w.build(mesh, compression, kind, check, intra_node=intra)
    return {"shards": w.train(model, opt, rank, steps), **record_bytes(state)}


def resumed(w, mesh, rank, steps, gather: bool) -> dict:
    """Straight through against saved at half the steps and resumed in a fresh model."""
    build = lambda: w.build(mesh, w.FROZEN, "adamw", intra_node=INT8_EF)  # noqa: E731
    model, opt, state = build()
    straight = w.train(model, opt, rank, steps)[-1]
    half = range(len(steps) // 2)
    model, opt, state = build()
    w.train(model, opt, rank, half)
    saved = ([p.to_local().detach().clone() for p in model.parameters()], opt.state_dict(),
             state.state_dict(gather=gather))
    model, opt, state = build()
    with torch.no_grad():
        for p, v in zip(model.parameters(), saved[0]):
            p.to_local().copy_(v)
    opt.load_state_dict(saved[1])
    state.load_state_dict(saved[2])
    loaded = state.in_node.state_dict()
    out = {"straight": straight, "resumed": w.train(model, opt, rank, range(len(half), len(steps)))[-1],
           "loaded_residuals": residuals(loaded), "keys": sorted(saved[2])}
    entry = saved[2]["in_node"]
    if gather:   # a list over the replicas of each replica's gathered in-node state (every rank's)
        out["saved_residuals"] = [[residuals({"tensors": t}) for t in per_replica["ranks"]] for per_replica in entry]
    else:
        out["saved_residuals"] = residuals(entry)
    return out


def refused(call) -> str:
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no error"


def refusals(w, mesh, rank) -> dict:
    out: dict = {}
    model = w.hsdp_model(mesh)
    opt = w.optimizer("adamw", model)
    for label, intra in (("dgc", {"compressor": "dgc", "sparsity": "0.95"}),
                         ("frozen", {"compressor": "onebit", "ef": "vanilla", "adam": "frozen"}),
                         ("powersgd", hc.PowerSGD(rank=1))):
        out[label] = refused(lambda: fsdp.compress(model, compression=w.FROZEN, optimizer=opt, intra_node=intra))
    scaler = torch.amp.GradScaler("cpu")
    out["scaler"] = refused(lambda: fsdp.compress(model, compression=None, optimizer=opt, scaler=scaler,
                                                  intra_node=hc.Int8()))
    # nothing of FSDP was changed: the same model still takes compress (its take-over runs once only)
    out["compress_after_refusals"] = refused(lambda: fsdp.compress(model, compression=w.FROZEN, optimizer=opt,
                                                                   intra_node=hc.Int8()))
    # checkpoints
    model, opt, state = w.build(mesh, w.FROZEN, "adamw", intra_node=INT8_EF)
    w.train(model, opt, rank, range(2))
    gathered, own = state.state_dict(gather=True), state.state_dict()
    before = (residuals(state.in_node.state_dict()), flat(state.state_dict()))
    other = copy.deepcopy(gathered)
    other["mesh"] = {"replicas": 1, "shards": 4}
    out["other_mesh"] = refused(lambda: state.load_state_dict(other))
    bad = copy.deepcopy(gathered)
    residual = bad["shards"][1][1]["2.weight"]["residual"]
    bad["shards"][1][1]["2.weight"]["residual"] = residual[:-1].clone()
    fresh_in_node = residuals(w.build(mesh, w.FROZEN, "adamw", intra_node=INT8_EF)[2].in_node.state_dict())
    zeroed = copy.deepcopy(gathered)   # an in-node state that differs from the live one
    zeroed["in_node"] = [copy.deepcopy(per_replica) for per_replica in zeroed["in_node"]]
    for per_replica in zeroed["in_node"]:
        for tensors in per_replica["ranks"]:
            for st in tensors.values():
                for k in st:
                    if k.endswith("residual"):
                        st[k] = torch.zeros_like(st[k])
    # refused by the mesh re-layout (before any load), and by the store's check (after the in-node load:
    # the in-node state is put back)
    out["corrupt_cross_node"] = refused(lambda: state.load_state_dict({**zeroed, "shards": bad["shards"]}))
    out["bad_version"] = refused(lambda: state.load_state_dict({**zeroed, "version": 999}))
    after = (residuals(state.in_node.state_dict()), flat(state.state_dict()))
    out["unchanged"] = after == before
    out["residuals_nonzero"] = any(any(x != 0 for x in v) for st in before[0].values() for v in st.values())
    out["fresh_in_node_empty"] = fresh_in_node == {}
    plain = w.build(mesh, w.FROZEN, "adamw")[2]
    out["into_no_in_node"] = refused(lambda: plain.load_state_dict(own))
    # a checkpoint without an in-node state (intra_node=None's) starts the in-node compressor afresh
    state.load_state_dict(plain.state_dict(gather=True))
    out["afresh"] = residuals(state.in_node.state_dict()) == {}
    return out


def in_node(w, mesh, rank: int, steps: range) -> list:
    """The records (module doc). ``w``: the worker module."""
    records = [
        {"case": "in_node:none_sgd", **trained(w, mesh, rank, steps, None, "sgd", {"compressor": "none"})},
        {"case": "in_node:none_frozen", **trained(w, mesh, rank, steps, w.FROZEN, "adamw", hc.NoCompression(), 1)},
        {"case": "in_node:int8_frozen", **trained(w, mesh, rank, steps, w.FROZEN, "adamw", hc.Int8(), 1)},
        {"case": "in_node:bf16_int8", **trained(w, mesh, rank, steps, {"compressor": "int8"}, "sgd",
                                                 {"compressor": "bf16"}, 1)},
    ]
    for gather in (True, False):
        records.append({"case": f"in_node:resume_{'gathered' if gather else 'local'}",
                        **resumed(w, mesh, rank, steps, gather)})
    records.append({"case": "in_node:refusals", **refusals(w, mesh, rank)})
    return records

