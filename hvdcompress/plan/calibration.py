"""Codec time per compressor on this machine: measured once, fitted, cached.

For each compressor, at a few tensor sizes n (square-ish matrices, so PowerSGD compresses them),
the best of a few runs of

* compress: every round's compression (PowerSGD's P and Q, CSC's norms and chunks);
* decode: decompressing one payload (for summable payloads: the allreduced sum);
* decode4: decompressing four gathered payloads (``decompress_gathered`` at world 4; the same
  as decode for summable payloads),

each fitted as ``t(n) = a + b·n`` by least squares (a and b clipped at 0). Decoding P gathered
payloads is taken as linear in P between one payload and four: ``d(n) + (P-1)/3·(d4(n) - d(n))``
(a dense-format decoder pays ~d per payload, a scatter-add of sparse payloads much less).

The fit is cached per machine and device in
``~/.cache/hvdcompress/calibration-<host>-<device>.json`` (keyed by the compressor's spec, see
:func:`hvdcompress.plan.payloads.spec_key`). Trade-off: a few sizes and best-of-3 keep the run
under half a minute; the fit ignores cache effects between the sizes measured, and a shared
machine's noise (take the numbers as an order of magnitude on CPU).
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple, Optional, Union

import numpy as np

from ..compressor import TensorInfo
from ..registry import from_params
from .device import Device, torch_device
from .payloads import spec_key

SIZES = (64 * 64, 256 * 256, 1024 * 1024, 16 * 1024 * 1024)  # up to 64 MB: past the last-level cache, as big tensors are (16 MB was not: its fit read DGC 2.5x faster than a 25M tensor runs)
GATHERED = 4   # the world of the decode4 measurement


class Fit(NamedTuple):
    """``a + b·n`` seconds for a tensor of n elements."""

    a: float
    b: float

    def at(self, numel: float) -> float:
        return self.a + self.b * numel


def fit_line(sizes: Iterable[float], seconds: Iterable[float]) -> Fit:
    """Least-squares ``a + b·n`` through the points, a and b clipped at 0."""
    b, a = np.polyfit(np.asarray(list(sizes), float), np.asarray(list(seconds), float), 1)
    return Fit(max(float(a), 0.0), max(float(b), 0.0))


@dataclass(frozen=True)
class CodecTimes:
    """One compressor's fitted codec times (see the module doc)."""

    compress: Fit
    decode: Fit
    decode4: Fit

    def compress_s(self, numel: float) -> float:
        return self.compress.at(numel)

    def decode_s(self, numel: float, payloads: int = 1) -> float:
        """Decoding ``payloads`` gathered payloads of a tensor of ``numel`` elements."""
        one = self.decode.at(numel)
        extra = max(self.decode4.at(numel) - one, 0.0) * (payloads - 1) / (GATHERED - 1)
        return one + extra


@dataclass(frozen=True)
class Calibration:
    """Codec times of this ``host`` and ``device``, by compressor spec key."""

    host: str
    device: str
    codecs: dict

    def times(self, spec: Mapping[str, str]) -> Optional[CodecTimes]:
        return self.codecs.get(spec_key(spec))

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "device": self.device,
                           "codecs": {k: asdict(v) for k, v in self.codecs.items()}}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        data = json.loads(text)
        codecs = {k: CodecTimes(*(Fit(*v[part]) for part in ("compress", "decode", "decode4")))
                  for k, v in data["codecs"].items()}
        return cls(data["host"], data["device"], codecs)


def cache_path(device: str, cache_dir: Optional[Path] = None, host: Optional[str] = None) -> Path:
    """Where this machine's calibration for ``device`` lives."""
    folder = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "hvdcompress"
    return folder / f"calibration-{host or socket.gethostname()}-{device}.json"


def load(path: Path) -> Optional[Calibration]:
    """The calibration cached at ``path``, or None when there is none."""
    return Calibration.from_json(path.read_text()) if path.exists() else None


def save(calibration: Calibration, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(calibration.to_json())
    return path


BUDGET_S = 0.25   # per measurement: runs go on, past ``repeats``, while their total is below it


def _best(device: Device, run: Callable[[], object], repeats: int) -> float:
    """The fastest of at least ``repeats`` runs, and of as many as fit in :data:`BUDGET_S`: on a
    shared machine the minimum is the least disturbed run (3 runs alone were off by 10x there)."""
    best, spent, runs = float("inf"), 0.0, 0
    while runs < repeats or spent < BUDGET_S:
        device.sync()
        start = time.perf_counter()
        run()
        device.sync()
        elapsed = time.perf_counter() - start
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best


def _codec_seconds(device: Device, spec: Mapping[str, str], numel: int, repeats: int) -> tuple:
    """(compress, decode, decode4) seconds of ``spec`` on one tensor of ``numel`` elements."""
    ops = device.ops
    rows = 1 << (max(numel.bit_length() - 1, 0) // 2)
    shape = (rows, numel // rows)
    numel = rows * shape[1]
    x = device.randn(numel, shape)
    info = TensorInfo(name="calibration", numel=numel, shape=shape, param=ops.zeros(numel, like=x))
    compressor = from_params(spec)
    state: dict = {}
    compressor.init_state(ops, x, state, info)

    def compress():
        packet = compressor.compress(ops, x, state, info)
        while packet.resume is not None:
            packet = packet.resume(packet.tensors)
        return packet

    packet = compress()
    gathered = [ops.concat([t] * GATHERED) for t in packet.tensors]

    def decode():
        return compressor.decompress(ops, packet.tensors, packet.ctx, info)

    def decode4():
        return compressor.decompress_gathered(ops, gathered, packet.ctx, info, GATHERED)

    seconds_decode = _best(device, decode, repeats)
    return (_best(device, compress, repeats), seconds_decode,
            seconds_decode if packet.summable else _best(device, decode4, repeats))


def calibrate(specs: Iterable[Mapping[str, str]], sizes: Iterable[int] = SIZES, repeats: int = 3,
              device: Union[str, Device] = "") -> Calibration:
    """Measure and fit the codec times of ``specs`` on ``device``: a torch device name ('' :
    CUDA when available) or a :class:`Device` (e.g. a TensorFlow front end's ops)."""
    dev = device if isinstance(device, Device) else torch_device(device)
    sizes = list(sizes)
    codecs = {}
    for spec in sorted(specs, key=spec_key):
        points = [_codec_seconds(dev, spec, n, repeats) for n in sizes]
        codecs[spec_key(spec)] = CodecTimes(*(fit_line(sizes, [p[i] for p in points]) for i in range(3)))
    return Calibration(socket.gethostname(), dev.name, codecs)
