"""The host checksum of an array's bytes, the replica check's reference: the CRC-32 of the bytes
in the high 32 bits, the sum of their 64-bit words (and the tail) mod 2^32 in the low 32 bits,
as a signed int64 (what an int64 collective carries). :mod:`hvdcompress.step.replicas` compares
it across ranks; the device checksums of the Ops implementations are checked against it."""
from __future__ import annotations

import zlib

import numpy as np


def signed64(value: int) -> int:
    """An unsigned 64-bit value as the signed int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def host_checksum(array: np.ndarray) -> int:
    """The host checksum of an array's bytes (see the module doc), as a signed int64."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    words = data[:data.size // 8 * 8].view(np.uint64).sum(dtype=np.uint64)
    tail = int.from_bytes(data[data.size // 8 * 8:].tobytes(), "little")
    return signed64((zlib.crc32(data) << 32) | ((int(words) + tail) & 0xFFFFFFFF))
