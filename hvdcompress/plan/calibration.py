"""Codec time per compressor on this machine: measured once, fitted, cached.

For each compressor, at a few tensor sizes n (square-ish matrices, so PowerSGD compresses them),
the best of a few runs of

* compress: every round's compression (PowerSGD's P and Q, CSC's norms and chunks);
* decode: decompressing one payload (for summable payloads: the allreduced sum);
* decode4: decompressing four gathered payloads (``decompress_gathered`` at world 4; the same
  as decode for summable payloads),

each fitted as ``t(n) = a + b·n`` through the ends of the sizes (:func:`fit_line`). Decoding P gathered
payloads is taken as linear in P between one payload and four: ``d(n) + (P-1)/3·(d4(n) - d(n))``
(a dense-format decoder pays ~d per payload, a scatter-add of sparse payloads much less).

**The reduction** (gamma, CPU devices only): seconds per byte of the local sum ``a += b`` that
a ring allreduce runs on (P-1)/P of its payload, per dtype (:func:`measure_reduction`). Gloo's
sum (``gloo::sum<T>``, in Horovod and in torch.distributed) is a plain loop; for float16 it
converts every element in software (Horovod's build has no F16C instructions in it), as
numpy's float16 add does, so numpy's add is the probe: here 0.47 ns per float32 element and
3.7 ns per float16 element, 8x the float32 cost per element for half the bytes. On a GPU the
reduction is fused in NCCL's kernels and not measured (gamma 0).

**Sharing the host** (``processes``): ranks that share a host share its memory bandwidth and
last-level cache, and a memory-bound codec runs slower beside its neighbours than alone (two
processes on a 2-core machine: DGC's and fp16's codecs 1.8-2x). ``calibrate(...,
processes=K)`` runs K calibrations at once, each measurement started together (a barrier), and
averages their fits; K = the ranks per host, at most its cores (more ranks than cores is
time-slicing, :attr:`hvdcompress.plan.Cluster.cpu_share`, not contention).

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Union

import numpy as np

from ..contract.compressor import TensorInfo
from ..registry import from_params
from .device import Device, torch_device
from .payloads import spec_key

REDUCED = ("float32", "float16")   # the dtypes whose sum is timed (others: float32's gamma)
REDUCE_ELEMENTS = 16 * 1024 * 1024  # a fusion buffer's worth: past the last-level cache
SIZES = (64 * 64, 256 * 256, 1024 * 1024, 16 * 1024 * 1024)  # up to 64 MB: past the last-level cache, as big tensors are (a fit that ends inside the cache reads big tensors' codecs too fast)
GATHERED = 4   # the world of the decode4 measurement


class Fit(NamedTuple):
    """``a + b·n`` seconds for a tensor of n elements."""

    a: float
    b: float

    def at(self, numel: float) -> float:
        return self.a + self.b * numel

    def scaled(self, factor: float) -> "Fit":
        return Fit(self.a * factor, self.b * factor)


def fit_line(sizes: Iterable[float], seconds: Iterable[float]) -> Fit:
    """``a + b·n`` through the ends of the measured sizes: ``b`` the slope between the two
    largest (the per-element cost past the last-level cache, where big tensors run), ``a`` what
    is left of the smallest's time (the fixed cost of a call, which a model of many small
    tensors, biases and norms, pays once per tensor); both clipped at 0. A least-squares line
    serves neither end: unweighted, 1% of noise on a 64 MB codec outweighs the fixed cost (read
    negative, every small tensor then free); in relative error, the sizes in cache, faster per
    element, pulled the slope down by up to 2x. Sizes in between are interpolated."""
    points = sorted(zip(sizes, seconds))
    if len(points) < 2:
        raise ValueError(f"fit_line: needs at least two sizes, got {len(points)}")
    (n0, t0), (n1, t1), (n2, t2) = points[0], points[-2], points[-1]
    b = max((t2 - t1) / (n2 - n1), 0.0) if n2 > n1 else 0.0
    return Fit(max(t0 - b * n0, 0.0), b)


@dataclass(frozen=True)
class CodecTimes:
    """One compressor's fitted codec times (see the module doc)."""

    compress: Fit
    decode: Fit
    decode4: Fit

    def compress_s(self, numel: float) -> float:
        return self.compress.at(numel)

    def scaled(self, factor: float) -> "CodecTimes":
        return CodecTimes(*(fit.scaled(factor) for fit in (self.compress, self.decode, self.decode4)))

    def decode_s(self, numel: float, payloads: int = 1) -> float:
        """Decoding ``payloads`` gathered payloads of a tensor of ``numel`` elements."""
        one = self.decode.at(numel)
        extra = max(self.decode4.at(numel) - one, 0.0) * (payloads - 1) / (GATHERED - 1)
        return one + extra


@dataclass(frozen=True)
class Calibration:
    """Codec times of this ``host`` and ``device``, by compressor spec key; ``reduce``: seconds
    per byte of the local sum by dtype (empty: not measured, gamma 0); ``processes``: how many
    calibrated at once (see the module doc); ``copy_s_per_byte``: a memory copy's seconds per
    byte (:mod:`hvdcompress.plan.front_ends`; 0: not measured); ``per_tensor`` and
    ``per_member``: the front end's seconds per tensor and per further member of a fused bucket
    in a job, by spec key (:mod:`hvdcompress.torch.job_costs`; empty: not measured)."""

    host: str
    device: str
    codecs: dict
    reduce: dict = field(default_factory=dict)
    processes: int = 1
    copy_s_per_byte: float = 0.0
    per_tensor: dict = field(default_factory=dict)
    per_member: dict = field(default_factory=dict)

    def times(self, spec: Mapping[str, str]) -> Optional[CodecTimes]:
        return self.codecs.get(spec_key(spec))

    def tensor_s(self, spec: Mapping[str, str], members: int = 1) -> float:
        """The front end's seconds per step for one tensor of ``spec`` (a fused bucket of
        ``members``): ``per_tensor`` + (members - 1) · ``per_member`` (``per_tensor`` where that
        was not measured); 0 where nothing was."""
        key = spec_key(spec)
        one = self.per_tensor.get(key, 0.0)
        return one + (members - 1) * self.per_member.get(key, one)

    def scaled(self, factor: float) -> "Calibration":
        """Every codec time times ``factor`` (``auto``'s re-plan: the codecs ran that much
        slower, or faster, in the job than when calibrated). The sums' gamma stays: they run
        inside the collectives, whose time the re-plan measures with the link's."""
        return replace(self, codecs={k: v.scaled(factor) for k, v in self.codecs.items()})

    def reduce_s(self, parts: Iterable[tuple]) -> float:
        """Seconds of summing one payload of ``parts`` ((dtype, bytes), ...) into another:
        ``sum(bytes · gamma[dtype])``, float32's gamma for a dtype not measured."""
        fallback = self.reduce.get("float32", 0.0)
        return sum(nbytes * self.reduce.get(dtype, fallback) for dtype, nbytes in parts)

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "device": self.device, "processes": self.processes,
                           "reduce": self.reduce, "copy": self.copy_s_per_byte,
                           "per_tensor": self.per_tensor, "per_member": self.per_member,
                           "codecs": {k: asdict(v) for k, v in self.codecs.items()}}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        data = json.loads(text)
        codecs = {k: CodecTimes(*(Fit(*v[part]) for part in ("compress", "decode", "decode4")))
                  for k, v in data["codecs"].items()}
        return cls(data["host"], data["device"], codecs, data.get("reduce", {}), data.get("processes", 1),
                   data.get("copy", 0.0), data.get("per_tensor", {}), data.get("per_member", {}))


def cache_path(device: str, cache_dir: Optional[Path] = None, host: Optional[str] = None,
               processes: int = 1) -> Path:
    """Where this machine's calibration for ``device`` (by ``processes`` at once) lives."""
    folder = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "hvdcompress"
    together = f"-x{processes}" if processes > 1 else ""
    return folder / f"calibration-{host or socket.gethostname()}-{device}{together}.json"


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
    shared machine the minimum is the least disturbed run (a fixed few can all be disturbed)."""
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


_HOST = Device("host", None, None, lambda: None)   # numpy's timings need no device sync


def measure_reduction(dtypes: Iterable[str] = REDUCED, numel: int = REDUCE_ELEMENTS,
                      repeats: int = 3) -> dict:
    """Seconds per byte of numpy's ``c = a + b`` on ``numel`` elements of each dtype (Gloo's
    ``sum(c, a, b, n)``; the best of :func:`_best`'s runs): the gamma of a CPU reduction (see
    the module doc). Bytes are one operand's: what the ring sends and sums."""
    rng = np.random.default_rng(0)
    gamma = {}
    for dtype in dtypes:
        a, b, c = (rng.standard_normal(numel).astype(dtype) for _ in range(3))
        seconds = _best(_HOST, lambda: np.add(a, b, out=c), repeats)
        gamma[dtype] = seconds / (numel * a.itemsize)
    return gamma


def measure_copy(numel: int = REDUCE_ELEMENTS, repeats: int = 3) -> float:
    """Seconds per byte of numpy's ``np.copyto`` of ``numel`` float32 elements (past the
    last-level cache): a front end's pass over a gradient (:mod:`hvdcompress.plan.front_ends`)."""
    a = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    b = np.empty_like(a)
    return _best(_HOST, lambda: np.copyto(b, a), repeats) / a.nbytes


def calibrate(specs: Iterable[Mapping[str, str]], sizes: Iterable[int] = SIZES, repeats: int = 3,
              device: Union[str, Device] = "", processes: int = 1) -> Calibration:
    """Measure and fit the codec times of ``specs`` on ``device``: a torch device name ('' :
    CUDA when available) or a :class:`Device` (e.g. a TensorFlow front end's ops); on a CPU
    also the reduction's gamma. ``processes`` > 1 (torch device names only): that many
    processes calibrate at once and their fits are averaged (see the module doc)."""
    specs, sizes = sorted(specs, key=spec_key), list(sizes)
    if processes <= 1:
        return _calibrate(specs, sizes, repeats, device, lambda: None)
    if isinstance(device, Device):
        raise ValueError(f"calibrate: processes={processes} needs a torch device name, not {device.name!r}")
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_worker, args=(specs, sizes, repeats, device, barrier, queue))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    results = [Calibration.from_json(queue.get()) for _ in workers]
    for worker in workers:
        worker.join()
    return _average(results)


def _calibrate(specs: list, sizes: list, repeats: int, device: Union[str, Device],
               wait: Callable[[], object]) -> Calibration:
    """One process's calibration; ``wait()`` before each measurement (a barrier, or nothing)."""
    dev = device if isinstance(device, Device) else torch_device(device)
    codecs = {}
    for spec in specs:
        points = []
        for n in sizes:
            wait()
            points.append(_codec_seconds(dev, spec, n, repeats))
        codecs[spec_key(spec)] = CodecTimes(*(fit_line(sizes, [p[i] for p in points]) for i in range(3)))
    on_cpu = dev.name.endswith("cpu")
    wait()
    reduce = measure_reduction(repeats=repeats) if on_cpu else {}
    wait()
    copy = measure_copy(repeats=repeats) if on_cpu else 0.0
    return Calibration(socket.gethostname(), dev.name, codecs, reduce, copy_s_per_byte=copy)


def _worker(specs: list, sizes: list, repeats: int, device: str, barrier: Any, queue: Any) -> None:
    queue.put(_calibrate(specs, sizes, repeats, device, barrier.wait).to_json())


def _average(results: list) -> Calibration:
    """The mean of the processes' fits (coefficient by coefficient) and gammas."""
    first = results[0]

    def mean_fit(fits: list) -> Fit:
        return Fit(float(np.mean([f.a for f in fits])), float(np.mean([f.b for f in fits])))

    codecs = {key: CodecTimes(*(mean_fit([getattr(r.codecs[key], part) for r in results])
                                for part in ("compress", "decode", "decode4")))
              for key in first.codecs}
    reduce = {dtype: float(np.mean([r.reduce[dtype] for r in results])) for dtype in first.reduce}
    copy = float(np.mean([r.copy_s_per_byte for r in results]))
    return Calibration(first.host, first.device, codecs, reduce, len(results), copy)
