"""One torchrun rank of the DDP hook's rank agreement and checkpoint checks
(tests/test_agreement.py, tests/test_checkpoint_validation.py). Every case in one launch:

    torchrun --standalone --nproc_per_node 2 tests/ddp/validation_worker.py agreement
    torchrun --standalone --nproc_per_node 2 tests/ddp/validation_worker.py checkpoint

``agreement``: for each case of :data:`AGREEMENT`, rank 1 builds its CompressionState with one
setting changed; every rank records the error of its first backward (the agreement runs at the
first bucket) or, when there is none, its parameters after one step. ``checkpoint``: the
refusals of tests/checkpoint_cases.py, each loaded into a state trained two steps: the error and
whether the state (its ``state_dict()``) is unchanged after it; and a version-0 checkpoint's
load, compared with the same checkpoint's at version 1.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from checkpoint_cases import NEWER_ENTRIES, OTHER_WIDTH, model, refusals, same, train, without  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
from hvdcompress.torch import ddp  # noqa: E402

#: case -> (rank 0's keyword arguments of CompressionState, rank 1's)
AGREEMENT = {
    "ef_fp16_vs_bf16": ({"compression": hc.ErrorFeedback(hc.FP16())}, {"compression": hc.ErrorFeedback(hc.BF16())}),
    "ef_none_vs_fp16": ({"compression": hc.ErrorFeedback(hc.NoCompression())},
                        {"compression": hc.ErrorFeedback(hc.FP16())}),
    "clip_one_rank": ({"clip_grad_norm": 1.0}, {}),
    "fusion": ({"fusion": True}, {}),
    "collective": ({"compression": hc.ErrorFeedback(hc.OneBit()), "collective": "alltoall"},
                   {"compression": hc.ErrorFeedback(hc.OneBit()), "collective": "allgather"}),
    "same": ({"compression": hc.ErrorFeedback(hc.FP16()), "clip_grad_norm": 1.0},
             {"compression": hc.ErrorFeedback(hc.FP16()), "clip_grad_norm": 1.0}),
}


class Run:
    """A DDP model of ``width``, its SGD and its hook state (keyword arguments of CompressionState)."""

    def __init__(self, width: int = 6, **options):
        options.setdefault("compression", hc.FP16())
        self.net = model(width)
        self.model = DDP(self.net)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.state = ddp.CompressionState(optimizer=self.opt, named_parameters=self.net.named_parameters(), **options)
        self.model.register_comm_hook(self.state, ddp.compression_hook)

    def train(self, steps: range) -> "Run":
        train(self.net, self.model, self.opt, dist.get_rank(), steps)
        return self


def agreement(rank: int) -> None:
    for case, options in AGREEMENT.items():
        try:
            run = Run(**options[min(rank, 1)]).train(range(1))
        except Exception as error:   # raised by backward(), from the hook
            write_result(rank, {"case": case, "error": f"{type(error).__name__}: {error}", "params": None})
            continue
        write_result(rank, {"case": case, "error": None,
                            "params": [p.detach().reshape(-1).tolist() for p in run.net.parameters()]})


def checkpoint(rank: int) -> None:
    topk = lambda: hc.ErrorFeedback(hc.TopK(0.25))   # noqa: E731
    target = Run(compression=topk()).train(range(2))
    own = copy.deepcopy(target.state.state_dict())
    wide = Run(OTHER_WIDTH, compression=topk()).train(range(2)).state.state_dict()
    dgc = Run(compression=hc.DGC(0.5, min_numel=1)).train(range(2)).state.state_dict()
    powersgd = Run(compression=hc.PowerSGD()).train(range(2))
    cases = {**{case: (target, *rest) for case, rest in refusals(own, wide, dgc).items()},
             "dgc_into_powersgd": (powersgd, dgc, "and this run has PowerSGD(")}
    for case, (run, saved, expected) in cases.items():
        before = copy.deepcopy(run.state.state_dict())
        try:
            run.state.load_state_dict(saved)
            error = None
        except ValueError as refused:
            error = str(refused)
        write_result(rank, {"case": case, "error": error, "expected": expected,
                            "unchanged": same(before, run.state.state_dict())})
    old = Run(compression=topk())
    old.state.load_state_dict(without(own, *NEWER_ENTRIES))
    new = Run(compression=topk())
    new.state.load_state_dict(own)
    write_result(rank, {"case": "version_zero", "error": None,
                        "same_as_version_one": same(old.state.state_dict(), new.state.state_dict()),
                        "loaded": same(new.state.state_dict()["tensors"], own["tensors"])})


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    {"agreement": agreement, "checkpoint": checkpoint}[sys.argv[1]](dist.get_rank())
    dist.barrier()   # no rank tears its connections down under another's last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
