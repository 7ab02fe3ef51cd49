"""benchmarks/fsdp_bench.py: the memory measure (held_bytes counts every live tensor storage once)
and the methods' compressors (``--int8-chunk``, the ``_serial`` ablation's same compressor)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hvdcompress as hc  # noqa: E402
from benchmarks.fsdp_bench import HSDP_METHODS, METHODS, SERIAL, compression, held_bytes  # noqa: E402


def test_held_bytes_counts_a_storage_once_and_forgets_it_when_freed():
    before = held_bytes()
    block = torch.zeros(1 << 18)                   # 1 MiB of float32
    views = (block[:10], block.view(512, 512), torch.nn.Parameter(block))
    state = {"exp_avg": torch.ones(1000, dtype=torch.float64)}   # inside a dict, as an optimizer's
    assert held_bytes() - before == (1 << 20) + 8000
    del block, views, state
    assert held_bytes() == before


def test_int8_methods_take_the_chunk_and_serial_methods_their_base_compressor():
    assert compression("dense", 256) is None and compression("dense" + SERIAL, 256) is None
    for method in ("int8", "int8_ag", "int8" + SERIAL):
        assert isinstance(compression(method, 256), hc.Int8) and compression(method, 256).chunk == 256
    for method in ("int8_ef", "int8_ef_ag", "int8_ef" + SERIAL):
        made = compression(method, 256)
        assert isinstance(made, hc.ErrorFeedback) and made.unwrap().chunk == 256
    assert hc.from_params(compression("int8_adam", 256)).unwrap().chunk == 256
    assert compression("int8").chunk == 2048   # Int8()'s default
    for method in METHODS + HSDP_METHODS:
        assert (compression(method) is None) == (method in ("dense", "bf16")), method
