"""The replica guard's pieces (hvdcompress.step.replicas) against numpy references, in one process:
the checksum on torch and TF tensors, argument and environment parsing, the counters checksum,
and the comparison over simulated ranks (tests/simulator.py). The guard under real Horovod
processes is tested in tests/test_replica_matrix.py."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from simulator import run_ranks

from hvdcompress.ops.torch_ops import TorchOps, device_checksum
from hvdcompress.step.replicas import ReplicaCheck, ReplicaMismatch, check_every, counters_checksum

SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def signed64(value: int) -> int:
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


def reference_checksum(a: np.ndarray) -> int:
    """The host checksum in plain Python: CRC-32 of the bytes times 2^32 plus the sum of the
    little-endian 64-bit words (the tail as one short word) mod 2^32."""
    data = a.tobytes()
    words = sum(int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8))
    return signed64((zlib.crc32(data) << 32) | (words % (1 << 32)))


def reference_device_checksum(a: np.ndarray) -> int:
    """sum_i bits_i * (2i + 1) mod 2^64 in Python integers."""
    bits = np.ascontiguousarray(a).reshape(-1).view(SIGNED[a.itemsize]).tolist()
    return signed64(sum(b * (2 * i + 1) for i, b in enumerate(bits)))


def arrays() -> list:
    rng = np.random.default_rng(3)
    return [rng.standard_normal((30, 7)).astype(np.float32) * 1e6,
            rng.standard_normal(1000).astype(np.float64),
            rng.standard_normal(17).astype(np.float16),
            np.array([-0.0, 0.0, np.inf, -np.inf], dtype=np.float32)]


def test_torch_checksums_equal_numpy_reference():
    xs = arrays()
    got = TorchOps().checksums([torch.from_numpy(a) for a in xs]).tolist()
    assert got == [reference_checksum(a) for a in xs]
    bf = torch.randn(33, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert TorchOps().checksums([bf]).item() == reference_checksum(bf.view(torch.int16).numpy())


def test_tf_checksums_equal_numpy_reference():
    tf = pytest.importorskip("tensorflow")
    from hvdcompress.ops.tf_ops import TFOps
    xs = arrays()
    got = TFOps().checksums([tf.constant(a) for a in xs] + [tf.Variable(xs[0])]).numpy().tolist()
    assert got == [reference_checksum(a) for a in xs] + [reference_checksum(xs[0])]


def test_device_checksum_equals_reference():
    """The CUDA path's formula, run here on CPU tensors."""
    for a in arrays()[:3]:
        assert device_checksum(torch.from_numpy(a)).item() == reference_device_checksum(a)


@pytest.mark.parametrize("checksum", [lambda x: TorchOps().checksums([x]).item(),
                                      lambda x: device_checksum(x).item()], ids=["host", "device"])
def test_checksum_sees_every_single_change_and_swaps(checksum):
    x = torch.randn(257, generator=torch.Generator().manual_seed(1))
    base = checksum(x)
    for i in (0, 100, 256):
        for bit in (0, 17, 31):
            y = x.clone()
            y.view(torch.int32)[i] ^= 1 << bit if bit < 31 else -(1 << 31)
            assert checksum(y) != base, (i, bit)
    swapped = x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert checksum(swapped) != base
    assert checksum(-0.0 * torch.ones(1)) != checksum(torch.zeros(1))


@pytest.mark.parametrize("value, env, expected", [
    (None, {}, None), (0, {}, None), (5, {}, 5), (None, {"HVDCOMPRESS_CHECK_REPLICAS": "100"}, 100),
    (None, {"HVDCOMPRESS_CHECK_REPLICAS": "0"}, None), (3, {"HVDCOMPRESS_CHECK_REPLICAS": "100"}, 3),
    (None, {"HVDCOMPRESS_CHECK_REPLICAS": " "}, None)])
def test_check_every(value, env, expected):
    assert check_every(value, env) == expected


@pytest.mark.parametrize("value, env, message", [
    (-1, {}, "check_replicas=-1"), (2.5, {}, "check_replicas=2.5"), (True, {}, "check_replicas=True"),
    ("10", {}, "check_replicas='10'"),
    (None, {"HVDCOMPRESS_CHECK_REPLICAS": "ten"}, "HVDCOMPRESS_CHECK_REPLICAS='ten'"),
    (None, {"HVDCOMPRESS_CHECK_REPLICAS": "-2"}, "HVDCOMPRESS_CHECK_REPLICAS=-2")])
def test_check_every_rejects_bad_values(value, env, message):
    with pytest.raises(ValueError, match="allowed") as err:
        check_every(value, env)
    assert message in str(err.value)


def test_counters_checksum_sees_counters_not_tensors():
    base = counters_checksum({"step": 3, "epoch": 1}, [("a", {"step": 2, "residual": torch.zeros(3)})])
    same = counters_checksum({"epoch": 1, "step": 3}, [("a", {"step": 2, "residual": torch.ones(3)})])
    assert base == same and -2 ** 63 <= base < 2 ** 63
    assert counters_checksum({"step": 4, "epoch": 1}, [("a", {"step": 2})]) != base
    assert counters_checksum({"step": 3, "epoch": 1}, [("a", {"step": 3})]) != base


def each_rank(size: int, body) -> list:
    """``body(rank, comm)`` on ``size`` simulated ranks; each rank's return value, or the
    ReplicaMismatch it raised."""
    def caught(comm):
        try:
            return body(comm.rank, comm)
        except ReplicaMismatch as e:
            return e
    return run_ranks(size, caught, timeout=30)


def test_guard_passes_identical_replicas_and_counts_its_collectives():
    def body(rank, comm):
        check = ReplicaCheck(3, TorchOps(), comm)
        w, read = torch.arange(10.0), []

        def named():
            read.append(check.steps)
            return [("w", w), ("b", torch.ones(2))]
        for _ in range(7):
            check.after_step(named, lambda: 42)
        return comm.calls, read
    assert each_rank(3, body) == [(2, [3, 6])] * 3  # steps 3 and 6 only read the parameters


def test_guard_names_first_differing_parameter_step_and_ranks_on_every_rank():
    def body(rank, comm):
        check = ReplicaCheck(2, TorchOps(), comm, ranks=[4, 5, 6])
        a, b = torch.zeros(5), torch.zeros(5)
        for step in range(1, 5):
            if step == 3 and rank == 1:
                b[2] = 1e-30  # differs from step 3 on: caught at step 4
            check.after_step(lambda: [("a", a), ("b", b)], lambda: 7)
    errors = each_rank(3, body)
    for e in errors:
        assert isinstance(e, ReplicaMismatch)
        text = str(e)
        assert "step 4" in text and "parameter 'b'" in text
        assert "ranks [4, 6] hold" in text and "ranks [5] hold" in text
    assert len({str(e) for e in errors}) == 1


def test_guard_reports_counters():
    def body(rank, comm):
        ReplicaCheck(1, TorchOps(), comm).after_step(lambda: [("w", torch.ones(3))], lambda: 10 + rank)
    for e in each_rank(2, body):
        assert isinstance(e, ReplicaMismatch) and "step counters" in str(e) and "step 1" in str(e)
