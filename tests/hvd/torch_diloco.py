"""hvdcompress.torch.DiLoCo on 2 ranks, every case of tests/test_diloco.py in one launch.

    horovodrun -np 2 -H localhost:2 --gloo python tests/hvd/torch_diloco.py horovod
    torchrun --standalone --nproc_per_node 2 tests/hvd/torch_diloco.py dist

``horovod``: over Horovod's global process set; ``dist``: over torch.distributed's gloo group
(Horovod is not imported). One record per case (``case=``), every tensor as a list of floats
(float32 values, exact in JSON):

* ``linear_nesterov`` / ``linear_plain``: loss = sum(w * c) with integer c (grad w = c exactly)
  and inner SGD at lr 0.5, dense outer sync: every value is exact but the outer step's, which the
  test's numpy reference does in the same float32 operations: the parameters after every step;
* ``adamw_dense`` / ``adamw_topk``: a small MLP under AdamW (0.9, 0.95); the anchor and this rank's
  parameters just before each sync, the parameters after it, the mean outer gradient each sync
  applied, the residuals at the end (top-k with error feedback);
* ``resume``: the parameters after 8 steps straight, and after checkpoints (model + DiLoCo state)
  taken at step 3 (this rank's) and 5 (gathered) and loaded into fresh objects;
* ``disagree_*``: the ValueError of a construction where ranks differ;
* (Horovod) examples/diloco_train.py, 40 steps with a checkpoint reloaded at step 15: its record.
"""
import os
import sys

import numpy as np
import torch

import hvdcompress as hc
import hvdcompress.step.diloco as core
import hvdcompress.torch as hvc

BACKEND = sys.argv[1]
if BACKEND == "horovod":
    import horovod.torch as hvd
    hvd.init()
    RANK = hvd.rank()
    sys.path.insert(0, os.path.dirname(__file__))
    from common import result
else:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    RANK = dist.get_rank()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    from hvdrun import write_result

    def result(rank, **values):
        write_result(rank, values)
torch.set_num_threads(1)
N = 12   # the linear model's size


def listed(t: torch.Tensor) -> list:
    return t.detach().reshape(-1).tolist()


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for _, p in sorted(model.named_parameters())])


def linear_gradient(rank: int, step: int) -> np.ndarray:
    """The integer gradient of rank ``rank`` at inner step ``step`` (the test recomputes it)."""
    return np.random.default_rng(1000 * rank + step).integers(-4, 5, N).astype(np.float32)


def linear(case: str, **outer) -> None:
    w = torch.nn.Parameter(torch.zeros(N))
    opt = hvc.DiLoCo(torch.optim.SGD([w], lr=0.5), named_parameters=[("w", w)], sync_every=3,
                     compression=hc.NoCompression(), **outer)
    after = []
    for step in range(8):
        opt.zero_grad()
        (w * torch.from_numpy(linear_gradient(RANK, step))).sum().backward()
        opt.step()
        after.append(listed(w))
    result(RANK, case=case, after=after, bytes=opt.total_bytes.as_dict())


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)   # the same on every rank: the parameters start equal
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Tanh(), torch.nn.Linear(24, 4))


def batch(step: int) -> tuple:
    gen = torch.Generator().manual_seed(100 * RANK + step)
    return torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)


def train(model, opt, first: int, last: int) -> None:
    for step in range(first, last):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def diloco(model, compression=None, sync_every: int = 2, **kw):
    return hvc.DiLoCo(torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95)),
                      named_parameters=model.named_parameters(), sync_every=sync_every,
                      compression=compression, **kw)


def adamw(case: str, compression, **kw) -> None:
    model = mlp()
    opt = diloco(model, compression, **kw)
    names = [n for n, _ in sorted(model.named_parameters())]
    before, after, grads = [], [], []
    sync, step_rule = opt.sync, core.outer_step

    def recording_sync():
        before.append({"anchor": listed(torch.cat([opt._sync.outer[n]["anchor"] for n in names])),
                       "params": listed(flat(model))})
        sync()
        after.append(listed(flat(model)))

    def recording_step(ops, state, g, settings):
        grads.append((len(before), listed(g)))
        return step_rule(ops, state, g, settings)
    opt.sync, core.outer_step = recording_sync, recording_step
    try:
        train(model, opt, 0, 6)
    finally:
        core.outer_step = step_rule
    tensors = opt.state_dict()["hvdcompress"]["tensors"]
    residuals = {n: listed(tensors[n]["residual"]) for n in names if "residual" in tensors[n]}
    sizes = {n: p.numel() for n, p in sorted(model.named_parameters())}
    # the mean outer gradient per sync, in name order: recording_step runs once per tensor
    per_sync = [listed(torch.cat([torch.tensor(g) for s, g in grads if s == k])) for k in range(1, len(before) + 1)]
    result(RANK, case=case, names=names, sizes=sizes, before=before, after=after, grads=per_sync,
           residuals=residuals, bytes=opt.total_bytes.as_dict(), last_sync=opt.last_sync_bytes.as_dict())


def resume() -> None:
    def fresh():
        model = mlp()
        return model, diloco(model, {"compressor": "topk", "k": 0.1, "ef": "vanilla"})
    model, opt = fresh()
    train(model, opt, 0, 8)
    straight = listed(flat(model))
    resumed = {}
    for at, gather in ((3, False), (5, True)):
        model, opt = fresh()
        train(model, opt, 0, at)
        saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                 "opt": opt.state_dict(gather=gather)}
        model, opt = fresh()
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        train(model, opt, at, 8)
        resumed[f"at{at}"] = listed(flat(model))
    result(RANK, case="resume", straight=straight, resumed=resumed, steps=opt.steps)


def disagree(case: str, **differing) -> None:
    model = mlp()
    if "perturb" in differing:
        differing.pop("perturb")
        with torch.no_grad():
            next(model.parameters())[0, 0] += RANK
    try:
        diloco(model, **differing)
        result(RANK, case=case, error=None)
    except ValueError as e:
        result(RANK, case=case, error=str(e))


def replicas_differ() -> None:
    """check_replicas=1: rank 1's anchor is nudged before the second sync; every rank must raise."""
    model = mlp()
    opt = diloco(model, {"compressor": "topk", "k": 0.1, "ef": "vanilla"}, check_replicas=1)
    train(model, opt, 0, 2)   # the first sync: replicas identical, the check passes
    if RANK == 1:
        with torch.no_grad():
            opt._sync.outer[sorted(opt._sync.outer)[0]]["anchor"][0] += 1.0
    try:
        train(model, opt, 2, 4)
        result(RANK, case="replicas_differ", error=None, syncs=opt.steps // 2)
    except hc.ReplicaMismatch as e:
        result(RANK, case="replicas_differ", error=str(e), syncs=opt.steps // 2)


group = {} if BACKEND == "horovod" else {"process_group": dist.new_group([0, 1])}
linear("linear_nesterov", outer_lr=0.7, outer_momentum=0.9, nesterov=True)
linear("linear_plain", outer_lr=1.0, outer_momentum=0.5, nesterov=False)
adamw("adamw_dense", hc.NoCompression(), **group)
adamw("adamw_topk", {"compressor": "topk", "k": 0.05, "ef": "vanilla"})
resume()
replicas_differ()
disagree("disagree_sync_every", sync_every=2 + RANK)
disagree("disagree_compression", compression={"compressor": "topk", "k": 0.05 * (1 + RANK), "ef": "vanilla"})
disagree("disagree_parameters", perturb=True)
if BACKEND == "horovod":   # examples/diloco_train.py in this launch: its record has no case
    import runpy
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "diloco_train.py")
    sys.argv = [example, "--steps", "40", "--sync-every", "10", "--resume-at", "15", "--val-bytes", "2048"]
    runpy.run_path(example, run_name="__main__")
