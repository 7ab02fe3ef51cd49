"""The array backend the plan measures with: hvdcompress's torch :class:`Ops` on CUDA when
available, else on the CPU. torch is imported on first use only, so the plan's model runs
without it (measured payloads and calibration need it)."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple


class Device(NamedTuple):
    """``ops`` on ``name`` ('cpu', 'cuda'); ``randn(n, shape)``: a seeded normal tensor of that
    shape, flattened; ``sync()``: wait for queued kernels (timings)."""

    name: str
    ops: Any
    randn: Callable[[int, tuple], Any]
    sync: Callable[[], None]


@functools.lru_cache(maxsize=None)
def torch_device(name: str = "") -> Device:
    """The torch device ``name`` ('' picks CUDA when available, else CPU)."""
    import torch

    from ..ops.torch_ops import TorchOps

    name = name or ("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device=name).manual_seed(0)

    def randn(numel: int, shape: tuple) -> Any:
        return torch.randn(shape or (numel,), generator=generator, device=name).view(-1)

    def sync() -> None:
        if name == "cuda":
            torch.cuda.synchronize()

    return Device(name, TorchOps(), randn, sync)
