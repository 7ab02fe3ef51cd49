"""tests/fsdp/hsdp_worker.py's resume at another mesh: onebit + EF + FrozenAdam trained on the
2 x 2 mesh for SAVED steps, its gathered checkpoint (and this rank's) saved with the full
parameters, then on each mesh of TARGETS (4 ranks as 1 x 4 and 4 x 1; ranks 0-1 as 1 x 2 and
2 x 1, the others idle) a fresh model with the saved parameters, the refused checkpoints tried
(this rank's; a gathered one with one residual cut short), the gathered one loaded, the loaded
state recorded, and MORE steps trained with the shards recorded after each."""
from __future__ import annotations

import copy

import torch
from torch.distributed.device_mesh import DeviceMesh

from hvdcompress.torch import fsdp

SAVED, MORE = 4, 2
#: case -> mesh shape (replicas, shards): the first R·S ranks
TARGETS = {"1x4": (1, 4), "4x1": (4, 1), "1x2": (1, 2), "2x1": (2, 1)}
CORRUPT = ("2.weight", 1, 1)   # tensor, replica, shard whose residual is cut short


def listed(states: dict) -> dict:
    """{name: {key: list or number}} of per-tensor states (JSON)."""
    return {n: {k: v.reshape(-1).tolist() if torch.is_tensor(v) else v for k, v in st.items()}
            for n, st in states.items()}


def corrupted(saved: dict) -> dict:
    bad = copy.deepcopy(saved)
    name, replica, shard = CORRUPT
    state = bad["shards"][shard][replica][name]
    state["residual"] = state["residual"][:-1].clone()
    return bad


def fresh(w, mesh, full: list, frozen: dict):
    """A model on ``mesh`` with the saved full parameters, its AdamW and compression state."""
    model = w.hsdp_model(mesh)
    shards, index = mesh.size(1), mesh.get_local_rank(1)
    with torch.no_grad():
        for p, value in zip(model.parameters(), full):
            rows = -(-value.shape[0] // shards)
            p.to_local().copy_(value[min(index * rows, value.shape[0]):(index + 1) * rows])
    opt = w.optimizer("adamw", model)
    return model, opt, fsdp.compress(model, compression=frozen, optimizer=opt)


def remesh(w, mesh, rank: int, world: int) -> list:
    """The records: ``remesh:saved`` (the gathered checkpoint's states, every rank), then one
    per target. ``w``: the worker module (its model, batches, optimizer, training loop)."""
    model, opt, state = w.build(mesh, w.FROZEN, "adamw")
    w.train(model, opt, rank, range(SAVED))
    saved, own = state.state_dict(gather=True), state.state_dict()
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    records = [{"case": "remesh:saved", "mesh": saved["mesh"], "own_mesh": own["mesh"],
                "grid": [[listed(states) for states in per_shard] for per_shard in saved["shards"]]}]
    for case, shape in TARGETS.items():
        size = shape[0] * shape[1]
        target = DeviceMesh("cpu", torch.arange(size).reshape(shape), mesh_dim_names=("replicate", "shard"))
        record: dict = {"case": f"remesh:{case}", "shape": shape, "idle": rank >= size}
        if rank < size:
            model, opt, state = fresh(w, target, full, w.FROZEN)
            errors = {}
            for label, bad in (("one_rank", own), ("corrupt", corrupted(saved))):
                try:
                    state.load_state_dict(bad)
                    errors[label] = "no error"
                except ValueError as error:
                    errors[label] = str(error)
            record["untouched_by_refusals"] = not state.driver.states.named()
            state.load_state_dict(saved)
            loaded = state.state_dict()
            try:
                state.load_state_dict(corrupted(saved))
            except ValueError:
                pass
            kept = listed(state.state_dict()["tensors"]) == listed(loaded["tensors"])
            record["kept_after_a_refusal"] = kept
            record.update(errors=errors, replica=target.get_local_rank(0), shard=target.get_local_rank(1),
                          loaded=listed(loaded["tensors"]), compressor=loaded["compressor"],
                          shards=w.train(model, opt, rank, range(SAVED, SAVED + MORE)))
        records.append(record)
    return records
