"""Checkpoints every front end must refuse whole (tests/test_checkpoint_validation.py): one table
for the Horovod torch optimizer (in the test's process) and the DDP hook (tests/ddp/validation_worker.py).

The model: ``Sequential(Linear(8, width), Linear(width, 2))``, state under '0.weight', '0.bias',
'1.weight', '1.bias'. Each case is the compressor part of a checkpoint (the optimizer's
``'hvdcompress'`` entry, the DDP state's ``state_dict()``) and a part of the message expected.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

WIDTH, OTHER_WIDTH = 6, 10
#: what a version-0 checkpoint (written before the version entry) lacks
NEWER_ENTRIES = ("version", "compression", "intra_node", "params")


def model(width: int = WIDTH) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Linear(width, 2))


def batch(rank: int, step: int) -> tuple:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)


def train(net: torch.nn.Module, step_model: torch.nn.Module, opt: Any, rank: int, steps: range) -> None:
    """``steps`` steps of ``opt`` on ``step_model`` (``net`` itself, or its DDP wrapper)."""
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(step_model(x), y).backward()
        opt.step()


def without(own: dict, *entries: str) -> dict:
    return {k: v for k, v in own.items() if k not in entries}


def refusals(own: dict, wide: dict, dgc: dict) -> dict:
    """case -> (a compressor checkpoint to refuse, a part of the message). ``own``: one rank's
    checkpoint of ``ErrorFeedback(TopK(0.25))`` on the model of :data:`WIDTH`; ``wide``: the
    same on the model of :data:`OTHER_WIDTH` (the same names); ``dgc``: one of DGC."""
    misshapen = copy.deepcopy(own)
    misshapen["tensors"]["0.weight"]["residual"] = torch.zeros(7)
    return {
        "dgc_into_topk": (dgc, "entry 'compression' holds DGC("),
        "other_widths": (wide, f"entry 'params' holds parameter '0.bias' with shape ({OTHER_WIDTH},), "
                               f"dtype torch.float32 and this run has shape ({WIDTH},)"),
        "state_shape": (misshapen, "entry 'residual' of tensor '0.weight' holds 7 elements; expected 48"),
        "no_tensors": (without(own, "tensors"), "lacks 'tensors' (one rank's) or 'ranks' (every rank's)"),
        "no_compressor": (without(own, "compressor"), "lacks 'compressor'"),
        "world": ({**own, "world": 3}, "of a run at 3 ranks, and this run has"),
        "version": ({**own, "version": 99}, "entry 'version' holds 99; this hvdcompress reads versions [0, 1]"),
        "not_a_dict": ([own], "the compressor checkpoint is a list"),
    }


def same(a: Any, b: Any) -> bool:
    """Whether two state dicts hold the same values (tensors bit for bit)."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
