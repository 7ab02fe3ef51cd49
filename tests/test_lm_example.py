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


def test_transformer_is_causal_and_sized_for_every_compressor():
    import sys

    import torch
    sys.path.insert(0, str(EXAMPLE.parent))
    from lm_train import build_model
    torch.manual_seed(0)
    model = build_model("transformer", 128, 128)
    x = torch.randint(0, 256, (2, 24))
    changed = x.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 256
    before, after = model(x), model(changed)
    assert torch.allclose(before[:, :12], after[:, :12], atol=1e-6)   # no peeking ahead
    assert not torch.allclose(before[:, 12:], after[:, 12:])
    weights = [p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    assert min(weights) >= 16384  # DGC and CSC compress every matrix (smaller ones go dense)
    with pytest.raises(ValueError, match="model='gru': allowed: 'lstm', 'transformer'"):
        build_model("gru", 1, 1)
