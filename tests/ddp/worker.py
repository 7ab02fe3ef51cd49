"""One torchrun rank of tests/test_ddp.py: trains tests/ddp/cases.py's model under
DistributedDataParallel with hvdcompress's communication hook, for each case asked, and writes
one record per case to its rank's result file (examples/hvdrun.py's ``write_result``).

    torchrun --standalone --nproc_per_node 2 tests/ddp/worker.py --cases none,dgc --steps 4 \
        --resume dgc

The first record holds :func:`collectives`' outputs of the adapter. Then one per case: the
parameters after ``--steps`` steps, the parameter names of every bucket the hook saw (to show
DDP rebuilt its buckets), each step's local gradients as DDP handed them to the hook (the
reference trains on them: :func:`cases.encode`), the bytes, the hook's ReplicaMismatch for a
case whose rank 1 changes a parameter (``perturb_at``), and for a ``--resume`` case the
parameters of training resumed from a checkpoint taken halfway (model, optimizer, hook state),
to compare with those of training straight through.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from cases import (  # noqa: E402
    BUCKET_CAP_MB,
    CASES,
    RANKS_PER_NODE,
    THREADS,
    Case,
    build_model,
    encode,
    flat_params,
    train_step,
)
from hvdrun import write_result  # noqa: E402

from hvdcompress import ReplicaMismatch  # noqa: E402
from hvdcompress.torch import ddp  # noqa: E402
from hvdcompress.torch.dist_collectives import DistCollectives  # noqa: E402


class Run:
    """A DDP model, its optimizer and its hook state for one case, from ``checkpoint`` if given."""

    def __init__(self, case: Case, checkpoint: dict | None = None):
        self.group = dist.new_subgroups(dist.get_world_size() // 2)[0] if case.halves else None
        self.net = build_model()
        self.model = DDP(self.net, bucket_cap_mb=BUCKET_CAP_MB, process_group=self.group)
        self.opt = case.optimizer(self.model.parameters())
        self.state = ddp.CompressionState(process_group=self.group, compression=case.compression(),
                                          optimizer=self.opt if case.take_over else None,
                                          named_parameters=self.net.named_parameters(),
                                          clip_grad_norm=case.clip_grad_norm,
                                          intra_node=case.intra_node and case.intra_node(),
                                          ranks_per_node=case.intra_node and RANKS_PER_NODE,
                                          check_replicas=case.check_replicas, fusion=case.fusion)
        self.perturb_at = case.perturb_at
        if checkpoint is not None:
            self.net.load_state_dict(checkpoint["model"])
            self.opt.load_state_dict(checkpoint["opt"])
            self.state.load_state_dict(checkpoint["hook"])
        self.layouts: list = []
        self.step = None
        self.grads: dict = {}   # step -> name -> encoded local gradient
        names = {p: n for n, p in self.net.named_parameters()}

        def recording(state, bucket):
            self.layouts.append([names[p] for p in bucket.parameters()])
            self.grads.setdefault(self.step, {}).update(
                {names[p]: encode(g) for p, g in zip(bucket.parameters(), bucket.gradients())})
            return ddp.compression_hook(state, bucket)
        self.model.register_comm_hook(self.state, recording)

    def train(self, first: int, last: int) -> None:
        for step in range(first, last):
            self.step = step
            if step == self.perturb_at and dist.get_rank() == 1:
                with torch.no_grad():
                    self.net.head.bias[0] += 1e-3
            train_step(self.model, self.opt, dist.get_rank(self.group), step)

    def checkpoint(self) -> dict:
        """Through torch.save and torch.load, as a file would."""
        buffer = io.BytesIO()
        torch.save({"model": self.net.state_dict(), "opt": self.opt.state_dict(),
                    "hook": self.state.state_dict()}, buffer)
        buffer.seek(0)
        return torch.load(buffer)


def collectives() -> dict:
    """The adapter's outputs, as (dtype, shape, values), for payloads that no single compressor
    produces together: sizes that differ per rank, an empty tensor on some ranks or on all,
    several dtypes and a 2-D tensor in one call; and whether its pairs take turns (gloo: yes)."""
    comm = DistCollectives()
    r, world = comm.rank, comm.world
    calls = {
        "allgather": comm.allgather([torch.arange(r + 1, dtype=torch.int16), torch.full((r % 2,), float(r)),
                                     torch.full((2, 3), r, dtype=torch.uint8)], "mixed"),
        "allgather_empty": comm.allgather([torch.empty(0)], "empty"),
        "allreduce": comm.allreduce([torch.full((3,), 0.5 + r, dtype=torch.float16),
                                     torch.full((2, 2), float(r))], "sum"),
        "alltoall": comm.alltoall([torch.arange(2 * world, dtype=torch.int16) + 100 * r], "swap"),
    }
    out = {kind: [(str(t.dtype), list(t.shape), t.reshape(-1).tolist()) for t in comm.wait(handle)]
           for kind, handle in calls.items()}
    return {**out, "pairs_take_turns": comm.pairs_take_turns(on_gpu=False)}


def run(cases: list, steps: int, resume: list) -> None:
    """Initialise torch.distributed (gloo, from the environment: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, which torchrun sets), write the adapter's record and one record per case, and
    tear the group down. tests/hvd/torch_scale16.py calls it under horovodrun.

    Computes on cases.THREADS threads, as the reference does: this thread's through
    torch.set_num_threads; Gloo's, where the hook's callbacks run, take the process's default,
    which the launch's OMP_NUM_THREADS sets (checked)."""
    if os.environ.get("OMP_NUM_THREADS") != str(THREADS):
        raise RuntimeError(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')!r}: launch the DDP worker "
                           f"with OMP_NUM_THREADS={THREADS}, the threads its reference computes on")
    torch.set_num_threads(THREADS)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    write_result(rank, {"case": "collectives", **collectives()})
    for name in cases:
        run = Run(CASES[name])
        record = {"case": name}
        if name in resume:
            half = steps // 2
            run.train(0, half)
            saved = run.checkpoint()
            again = Run(CASES[name], saved)
            again.train(half, steps)
            record["resumed"] = flat_params(again.net)
            record["resumed_layouts"] = again.layouts
            run.train(half, steps)
        elif CASES[name].perturb_at is not None:
            try:
                run.train(0, steps)
            except ReplicaMismatch as error:
                record["mismatch"] = str(error)
        else:
            run.train(0, steps)
        record.update(params=flat_params(run.net), layouts=run.layouts,
                      grads=[run.grads[step] for step in sorted(run.grads)],
                      sent_bytes=run.state.total_bytes.sent,
                      dense_bytes=run.state.total_bytes.dense,
                      states=sorted(run.state.state_dict()["tensors"]))
        write_result(rank, record)
    dist.barrier()   # no rank tears its connections down under another's last collective
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    run(args.cases.split(","), args.steps, [c for c in args.resume.split(",") if c])


if __name__ == "__main__":
    main()
