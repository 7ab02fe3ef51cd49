"""One torchrun rank of tests/test_ddp_parity.py: the DDP hook's share of the features every
front end has (issue 35): ``scaler=``, a gathered checkpoint resumed at another world size, a
state built before ``init_process_group``. Each case writes one record (examples/hvdrun.py).

    torchrun --nproc_per_node 2 parity_worker.py --save DIR   # the cases at 2 ranks; checkpoints to DIR
    torchrun --nproc_per_node 3 parity_worker.py --load DIR   # those checkpoints at 3 ranks
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from cases import THREADS, batch, build_model, flat_params, sgd  # noqa: E402
from hvdrun import write_result  # noqa: E402

import hvdcompress as hc  # noqa: E402
from hvdcompress.torch import ddp  # noqa: E402

STEPS, OVERFLOW_AT, SCALE = 5, 2, 2.0 ** 10


def onebit_ef() -> hc.Compressor:
    return hc.ErrorFeedback(hc.OneBit())


def topk_ef() -> hc.Compressor:
    return hc.ErrorFeedback(hc.TopK(0.1))


class Run:
    """A DDP model with the hook; ``state`` may come built (before the process group)."""

    def __init__(self, compression=None, scaler=None, net=None, opt=None, state=None):
        self.net = net or build_model()
        self.model = DDP(self.net)
        self.opt = opt or sgd(self.net.parameters())
        self.scaler = scaler
        self.state = state or ddp.CompressionState(compression=compression, optimizer=self.opt, scaler=scaler,
                                                   named_parameters=self.net.named_parameters())
        self.model.register_comm_hook(self.state, ddp.compression_hook)

    def step(self, rank: int, step: int, overflow: bool = False) -> None:
        """One step on this rank's batch of ``step``: the user's AMP loop with a scaler; with
        ``overflow`` rank 1's loss is inf."""
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        if overflow and rank == 1:
            loss = loss * float("inf")
        self.opt.zero_grad()
        if self.scaler is None:
            loss.backward()
            self.opt.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def tensors(self) -> dict:
        return {n: {k: v.reshape(-1).tolist() for k, v in st.items() if torch.is_tensor(v)}
                for n, st in self.state.driver.states.items()}


def scaler_case(rank: int) -> None:
    """The run with a GradScaler (rank 1 overflows at OVERFLOW_AT) against the run without one
    that leaves that step's batch out."""
    plain = Run(onebit_ef())
    for step in range(STEPS):
        if step != OVERFLOW_AT:
            plain.step(rank, step)
    amp = Run(onebit_ef(), scaler=torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=2))
    record = {}
    for step in range(STEPS):
        before = (amp.tensors(), amp.scaler.get_scale(), flat_params(amp.net))
        amp.step(rank, step, overflow=step == OVERFLOW_AT)
        if step == OVERFLOW_AT:
            record = {"state_kept": amp.tensors() == before[0], "params_kept": flat_params(amp.net) == before[2],
                      "scale_before": before[1], "scale_after": amp.scaler.get_scale()}
    write_result(rank, {"case": "scaler", "plain": flat_params(plain.net), "amp": flat_params(amp.net),
                        "bytes_sent": amp.state.total_bytes.sent, **record})


def pre_init_case(rank: int, early: Run) -> None:
    """The state built before init_process_group trains as one built after it."""
    late = Run(topk_ef())
    for step in range(3):
        early.step(rank, step)
        late.step(rank, step)
    write_result(rank, {"case": "pre_init", "early": flat_params(early.net), "late": flat_params(late.net)})


def auto_case(rank: int) -> None:
    """compression="auto" through the hook: the plan made at the first exchange, alike on every rank."""
    run = Run("auto")
    for step in range(3):
        run.step(rank, step)
    plan = {name: list(map(str, pick)) for name, pick in sorted(run.state.compressor.plan.items())}
    write_result(rank, {"case": "auto", "params": flat_params(run.net), "plan": plan,
                        "bytes": run.state.total_bytes.as_dict()})


def save_case(rank: int, directory: Path) -> None:
    """Three steps of top-k + EF at 2 ranks; the hook's state gathered (rank 0 saves it) and
    each rank's own."""
    run = Run(topk_ef())
    for step in range(3):
        run.step(rank, step)
    gathered = run.state.state_dict(gather=True)
    if rank == 0:
        torch.save({"model": run.net.state_dict(), "hook": gathered}, directory / "gathered.pt")
    torch.save({"hook": run.state.state_dict()}, directory / f"own{rank}.pt")
    write_result(rank, {"case": "saved", "tensors": run.tensors(), "ranks_saved": len(gathered["ranks"])})


def load_case(rank: int, directory: Path) -> None:
    """At 3 ranks: the gathered state laid out for this rank, then one rank's state refused."""
    saved = torch.load(directory / "gathered.pt")
    run = Run(topk_ef())
    run.net.load_state_dict(saved["model"])
    run.state.load_state_dict(saved["hook"])
    loaded = run.tensors()
    try:
        Run(topk_ef()).state.load_state_dict(torch.load(directory / "own0.pt")["hook"])
        refused = None
    except ValueError as error:
        refused = str(error)
    run.step(rank, 3)
    write_result(rank, {"case": "loaded", "tensors": loaded, "refused": refused, "after": flat_params(run.net)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    early_net = build_model()   # the state built before the process group exists (Lightning's way)
    early_opt = sgd(early_net.parameters())
    early_state = ddp.CompressionState(compression=topk_ef(), optimizer=early_opt,
                                       named_parameters=early_net.named_parameters())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.load is not None:
        load_case(rank, args.load)
    else:
        pre_init_case(rank, Run(net=early_net, opt=early_opt, state=early_state))
        scaler_case(rank)
        auto_case(rank)
        save_case(rank, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
