"""The compressed allreduce under horovodrun at 3 ranks (Horovod's alltoall and allgather on
Gloo), torch optimizer and TF tape, against the numpy reference of tests/test_exchange.py."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import run_horovod
from test_exchange import reference

pytestmark = pytest.mark.horovod


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_compressed_allreduce_at_three_ranks_matches_numpy(framework):
    results = run_horovod("alltoall_compressed.py", np=3, args=[framework, "auto"], timeout=300)
    steps = reference(3, 999, steps=2, ef=True)
    expected = -(steps[0] + steps[1])  # SGD lr 1 from 0 (torch); minus the sum of gradients (TF)
    assert len(results) == 3
    for r in results:
        assert r["plan"][1] == "alltoall"
        np.testing.assert_allclose(r["w"], expected, rtol=1e-5, atol=1e-7)
    assert results[0]["w"] == results[1]["w"] == results[2]["w"]
