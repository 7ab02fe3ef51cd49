"""1-bit sign compression: signSGD (Bernstein et al. 2018), optionally scaled (Seide et al. 2014).

``C(g) = s · sign(g)`` with ``s = mean|g|`` (``scale=True``) or ``s = 1``: one bit per element
plus 4 bytes, 32x fewer bytes than float32, allgathered. Biased: the magnitude of every element
is replaced by the mean, so pair it with error feedback (:class:`EFSignSGD` or ``ef="vanilla"``)
for SGD-like convergence; unscaled signs need a learning rate tuned for them (about 1e-4).
Zeros are sent as +s (-0.0 as -s).

``chunk=c`` gives every run of c elements its own scale: ``C(g)_i = s_{i // c} · sign(g_i)``,
``s_j = mean |g|`` over run j (the last run may be shorter), 1 + 32/c bits per element;
``chunk="rows"`` a scale per row of the tensor (numel / shape[0] elements: an embedding's token,
a linear layer's output unit, a convolution's output channel; whole rows of at least
:data:`MIN_RUN` elements share one; a 1-D tensor keeps one scale). The compressed allreduce
cuts tensors into segments of whole rows where it can (their info's shape says so).

The L2-optimal scale of a run is its mean |g|, so the error ``||g - C(g)||²`` is
``sum_j c·var_j(|g|)`` with runs against ``n·var(|g|)`` with one scale. Where magnitudes differ
between the rows of one tensor (embedding rows of frequent and rare tokens, all zero when the
token is absent; an LSTM's gates), one scale sends the quiet rows far too much (a zero row gets
±s every step, which error feedback takes back later) and the loud ones too little; under the
Adam take-over, which divides each coordinate by its RMS, that error is what the update shows.
A scale per row (or per run of 64) follows the rows' sizes; a run of 256 already mixes quiet
and loud rows. The cost: the scales (1 + 32/c bits per element: 1.03 at rows of 1,024, 1.5 at
64) and a slower codec (:func:`sign_runs_sum`, one table look-up per byte instead of per 8 codes).
``chunk="auto"`` (default) is one scale per tensor, except under
:class:`~hvdcompress.adam.frozen.FrozenAdam`, which takes a copy with ``"rows"``
(:meth:`OneBit.for_adam`).

Evidence: benchmarks/README.md section 8 (Compression with AdamW), "Why the defaults"; codec
time: section 4 (Kernel throughput).
"""
from __future__ import annotations

import copy

from typing import Any, Optional, Tuple, Union

import numpy as np

from ..contract.compressor import AdamNeeds, Compressor, TensorInfo, decode_into
from ..contract.validation import check_bool, check_int
from ..ops.facade import Ops, Tensor
from .payload import constant
from .quant import TableQuantizer

#: the fewest elements that share a scale with ``chunk="rows"`` (short rows are grouped)
MIN_RUN = 32


class OneBit(TableQuantizer):
    """Signs, scaled by mean |g| when ``scale`` is true, per tensor or per ``chunk`` elements."""

    name = "onebit"
    adam_needs = AdamNeeds(long_warmup_ranks=4)
    bits = 1

    def __init__(self, scale: bool = True, chunk: Union[int, str, None] = "auto"):
        self.scale = check_bool("OneBit", "scale", scale)
        if chunk not in ("auto", "rows", None):
            if isinstance(chunk, (str, bool)):
                raise ValueError(f"OneBit: chunk={chunk!r}; allowed: 'auto', 'rows', None or an int >= 1")
            chunk = check_int("OneBit", "chunk", chunk, 1)
        self.chunk = chunk

    def for_adam(self) -> Compressor:
        """Under the Adam take-over ``chunk="auto"`` is a scale per row (a copy; this one stays):
        Adam divides each coordinate by its RMS, so one scale per tensor sends the quiet
        coordinates ±s every step; a scale per row follows their size."""
        if self.chunk != "auto":
            return self
        clone = copy.copy(self)
        clone.chunk = "rows"
        return clone

    def runs(self, info: TensorInfo) -> Optional[int]:
        """The elements per scale for this tensor: None for one scale per tensor."""
        if not self.scale or self.chunk in ("auto", None):
            return None
        if self.chunk != "rows":
            return self.chunk
        if len(info.shape) < 2 or not info.shape[0] or info.numel <= MIN_RUN:
            return None
        row = info.numel // info.shape[0]
        return row * -(-MIN_RUN // row)

    def unit_table(self) -> np.ndarray:
        return np.array([-1.0, 1.0], dtype=np.float32)

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        runs = self.runs(info)
        if runs is not None:
            return ops.sign_pack_runs(x, runs)
        packed, mean = ops.sign_pack(x)
        return packed, mean if self.scale else constant(ops, 1.0, x)

    def scales_per_rank(self, info: TensorInfo) -> int:
        runs = self.runs(info)
        return 1 if runs is None else -(-info.numel // runs)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        runs = self.runs(info)
        if runs is None:
            return super().decompress_gathered(ops, tensors, ctx, info, world, out)
        codes, scales = self.checked(ops, tensors, info, world)
        return decode_into(ops, out, ctx, lambda buf: ops.sign_runs_sum(codes, scales, info.numel, runs, out=buf))
