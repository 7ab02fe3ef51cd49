"""benchmarks/warmup_codes.py: a code's error on the mean over the mean's sampling noise, for the
first N ranks (numpy references), with a stand-in codec of known error and with the real ones."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import warmup_codes  # noqa: E402


def rank_grads(ranks: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [[torch.from_numpy(rng.normal(0.0, 1.0, 300).astype(np.float32)),
             torch.from_numpy(rng.normal(0.5, 0.1, 50).astype(np.float32))] for _ in range(ranks)]


def test_the_ratio_is_the_codes_error_over_the_means_noise(monkeypatch):
    """A codec that adds 0.01 to every element: error 0.01·sqrt(350) on the mean, and the server's
    re-send of the sum adds 0.01 / N more; noise = sqrt(sum of the per-element variances / N)."""
    monkeypatch.setattr(warmup_codes, "decoded", lambda codec, x: x + 0.01)
    grads = rank_grads(4)
    found = warmup_codes.errors(grads, worlds=(2, 4))
    for n in (2, 4):
        per_element = np.concatenate([np.stack([g[i].numpy() for g in grads[:n]]).astype(np.float64)
                                      for i in range(2)], axis=1)
        noise = np.sqrt((per_element.var(axis=0, ddof=1)).sum() / n)
        assert found[n]["int8"] == pytest.approx(0.01 * np.sqrt(350) / noise, rel=1e-4)
        assert found[n]["int4"] == pytest.approx(found[n]["int8"], rel=1e-6)
        assert found[n]["int4 + server"] == pytest.approx(0.01 * (1 + 1 / n) * np.sqrt(350) / noise, rel=1e-4)
        size = np.sqrt((per_element.mean(axis=0) ** 2).sum())
        assert found[n]["int8 / mean"] == pytest.approx(0.01 * np.sqrt(350) / size, rel=1e-4)


def test_int4_errs_more_than_int8_with_the_real_codes():
    found = warmup_codes.errors(rank_grads(2, seed=1), worlds=(2,))[2]
    assert 0.0 < found["int8"] < found["int4"] / 8 < found["int4 + server"] / 8
