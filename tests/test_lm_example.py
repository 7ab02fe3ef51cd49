"""The language-model example (examples/lm_train.py) as a user runs it: 2 Horovod ranks, DGC,
gradients clipped with ``clip_grad_norm=``."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_horovod

EXAMPLE = Path(__file__).parent.parent / "examples" / "lm_train.py"


@pytest.mark.horovod
def test_lm_example_trains_with_dgc_and_clipping():
    # A small model and a short run: 40 steps of 8 windows of 32 bytes per rank; no warm-up, so
    # the last step is sent at the target sparsity 0.999; Nesterov momentum, as recommended.
    records = run_horovod(str(EXAMPLE), np=2, timeout=300, args=[
        "--compression", "dgc", "--warmup-epochs", "0", "--clip", "0.5", "--steps", "40",
        "--epoch-steps", "20", "--batch-size", "8", "--seq-len", "32", "--hidden", "128",
        "--embed", "128", "--val-bytes", "4096", "--nesterov"])
    assert sorted(r["rank"] for r in records) == [0, 1]
    first, second = records
    assert first["param_checksum"] == second["param_checksum"]  # ranks stay in sync
    assert first["final_bpb"] == second["final_bpb"]
    assert first["compression"] == "dgc"
    assert [step for step, _ in first["curve"]] == [0, 20, 40]
    assert 0 < first["sent_bytes"] * 10 < first["dense_bytes"]
    # From about 8 bits/byte (a uniform guess) the loss must fall: 40 steps reach 4.8 here
    # (dense with the same clipping: 3.9).
    assert first["initial_bpb"] > 7.5
    assert first["final_bpb"] < first["initial_bpb"] - 1.0, first["curve"]


@pytest.mark.horovod
def test_lm_example_trains_with_adamw_and_the_adam_take_over():
    # 40 steps, the first 10 at full precision (freeze_steps=10), then 1-bit momentum
    records = run_horovod(str(EXAMPLE), np=2, timeout=300, args=[
        "--optimizer", "adamw", "--lr", "0.003", "--params",
        "compressor=onebit,ef=vanilla,adam=frozen,freeze_steps=10", "--clip", "0.5", "--steps", "40",
        "--epoch-steps", "20", "--batch-size", "8", "--seq-len", "32", "--val-bytes", "4096"])
    first, second = sorted(records, key=lambda r: r["rank"])
    assert first["param_checksum"] == second["param_checksum"]
    assert 0 < first["sent_bytes"] * 20 < first["dense_bytes"]  # the last step is 1-bit
    assert first["initial_bpb"] > 7.5
    assert first["final_bpb"] < first["initial_bpb"] - 1.0, first["curve"]
