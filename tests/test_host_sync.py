"""The exchange reads nothing back from the device where it need not (issue 13, item 1).

Every registered compressor trains the test MLP (four tensors: two weight matrices of 19200
and 3000 elements, two biases) for backward + step under real Horovod at 2 ranks, on the path
CUDA tensors take without triton: the plain-torch fallback, forced with
HVDCOMPRESS_DISABLE_KERNELS=1 (tests/hvd/torch_host_sync.py). The script counts the calls of
``torch.Tensor.item``, ``__float__``, ``__int__``, ``__bool__``, ``tolist``, ``cpu`` and
``numpy`` made from hvdcompress/ (each would stall a CUDA stream) and reports them per
compressor with their call sites.

Budget per step (docs/host_sync.md has the measured table):

* fixed-size payloads (fp16/bf16, randomk, topk with a count, the quantisers, PowerSGD, CSC):
  zero reads;
* variable-size payloads (DGC, threshold): at most one read per group and round, i.e. never one
  per tensor. DGC runs with ``min_numel=1000`` so that both weight matrices are sparse.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_horovod
from randomk_reference import np_shared_indices

import hvdcompress

torch = pytest.importorskip("torch")

STEPS = 3
VARIABLE_SIZE = {"dgc", "threshold"}
EXTRA = {"dgc": {"min_numel": "1000"}}


def budget(name: str) -> int:
    """The most device-to-host reads allowed over STEPS steps (one group, one round per step)."""
    return STEPS if name in VARIABLE_SIZE else 0


@pytest.mark.horovod
def test_host_reads_within_budget():
    pytest.importorskip("horovod.torch")
    specs = [{"compressor": name, **EXTRA.get(name, {})} for name in hvdcompress.available()]
    records = run_horovod("torch_host_sync.py", np=2, args=[str(STEPS), json.dumps(specs)],
                          timeout=600)
    assert len(records) == 2
    for name, entry in sorted(records[0]["report"].items()):  # the table of docs/host_sync.md (-s)
        print(f"| {name} | {entry['reads'] / STEPS:g} | {', '.join(sorted(entry['sites'])) or '-'} |")
    for record in records:
        assert record["steps"] == STEPS
        report = record["report"]
        assert sorted(report) == sorted(hvdcompress.available())
        over = {name: entry["sites"] for name, entry in report.items()
                if entry["reads"] > budget(name)}
        assert not over, f"rank {record['rank']}: host reads over budget ({STEPS} steps): {over}"


@pytest.mark.parametrize("n,k,key", [(1000, 20, 0), (777, 777, 2 ** 32 - 1), (50, 1, 12345), (10, 0, 7),
                                     (103, 10, 99), (2 ** 26 + 3, 1000, 5)])
def test_shared_indices_same_on_device_and_host(n, k, key):
    """RandomK's indices: the device version (TorchOps, on the tensor's device) and the host
    numpy version (Ops' default, TensorFlow's) both equal the reference."""
    from hvdcompress.ops.facade import Ops
    from hvdcompress.ops.torch_ops import TorchOps
    ops, like = TorchOps(kernels=False), torch.zeros(1)
    want = np_shared_indices(n, k, key)
    device = ops.shared_indices(n, k, key, like)
    assert device.dtype == torch.int64 and device.device == like.device
    np.testing.assert_array_equal(device.numpy(), want)
    np.testing.assert_array_equal(Ops.shared_indices(ops, n, k, key, like).numpy(), want)
