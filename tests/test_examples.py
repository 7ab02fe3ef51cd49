"""The PyTorch example as a user runs it, under horovodrun, with compressors chosen by
``--params`` (the registry's key=value strings)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_horovod

EXAMPLE = Path(__file__).parent.parent / "examples" / "pytorch_train.py"


@pytest.mark.horovod
def test_example_trains_with_a_compressor_given_as_strings():
    """One launch: a compressor with two decorators from ``--params``, as a user writes it, and
    fused compression (every compressor's training is covered by the replica matrix and the
    convergence tests)."""
    params = "compressor=onebit,ef=vanilla,momentum=plain"
    results = run_horovod(str(EXAMPLE), np=2, args=["--params", params, "--epochs", "3",
                                                    "--hidden", "256", "--fusion", str(1 << 20)])
    assert len(results) == 2
    first, second = results
    assert first["param_checksum"] == second["param_checksum"]  # ranks stay in sync
    assert first["compression"] == params.split(",")[0].split("=")[1]
    assert first["sent_bytes"] * 10 < first["dense_bytes"]
    assert first["accuracy"] > 0.8, first  # dense reaches 0.90 in the same 3 epochs
