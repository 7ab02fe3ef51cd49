"""benchmarks/fsdp_bench.py's memory measure: held_bytes counts every live tensor storage once."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.fsdp_bench import held_bytes  # noqa: E402


def test_held_bytes_counts_a_storage_once_and_forgets_it_when_freed():
    before = held_bytes()
    block = torch.zeros(1 << 18)                   # 1 MiB of float32
    views = (block[:10], block.view(512, 512), torch.nn.Parameter(block))
    state = {"exp_avg": torch.ones(1000, dtype=torch.float64)}   # inside a dict, as an optimizer's
    assert held_bytes() - before == (1 << 20) + 8000
    del block, views, state
    assert held_bytes() == before
