"""A compressor defined outside the package, with the public contract only (issue 51, item 4):
top-k by magnitude whose values travel as float16 and whose indices as int32.

    import external_compressor                  # registers "halftopk"
    hvdcompress.from_params({"compressor": "halftopk", "k": "0.05", "ef": "vanilla"})

It uses nothing but ``hvdcompress.Compressor``, ``Packet``, ``TensorInfo``, ``register`` and the
``ops`` object every call is handed (``topk_abs``, ``cast``, ``sparse_sum``, ``into``, ``dtype``),
so the same class runs on torch and TensorFlow tensors, on every front end: the Horovod torch
optimizer and the TF tape (allgather of the payloads), the DDP hook, and FSDP1/FSDP2, whose
sharded reduce-scatter it reaches by declaring ``fixed_size_payload`` (k pairs for a tensor of
n elements: a size fixed by n). tests/test_external_compressor.py trains with it on each.

One rank's payload for a flat gradient ``x`` of n elements, ``k = max(1, ceil(fraction · n))``
(at most n)::

    idx    = the k largest |x_i| (ties to the lower index), int32
    values = float16(x[idx])                   (round to nearest even)

and the sum over ranks is one float32 scatter-add of every rank's values at its indices.
"""
from __future__ import annotations

import math

import hvdcompress
from hvdcompress import Compressor, Packet, TensorInfo

NAME = "halftopk"


def count(fraction: float, numel: int) -> int:
    """How many elements a tensor of ``numel`` sends: ``ceil(fraction · numel)`` in [1, numel]
    (``round`` first, so that 0.05 · 1000 is 50, not 51)."""
    return min(numel, max(1, math.ceil(round(fraction * numel, 6))))


@hvdcompress.register
class HalfTopK(Compressor):
    """Send the ``k`` (a fraction of the tensor) largest-magnitude elements, values as float16."""

    name = NAME
    fixed_size_payload = True   # k (value, index) pairs, k fixed by the tensor's size

    def __init__(self, k: float = 0.05):
        if not 0.0 < float(k) <= 1.0:
            raise ValueError(f"HalfTopK: k={k!r}; allowed: a fraction in (0, 1]")
        self.k = float(k)

    def compress(self, ops, x, state: dict, info: TensorInfo) -> Packet:
        x32 = x if ops.dtype(x) == "float32" else ops.cast(x, "float32")
        values, indices = ops.topk_abs(x32, count(self.k, info.numel))
        # ctx (never sent): the gradient's dtype, for the decoded tensor
        return Packet([ops.cast(values, "float16"), ops.cast(indices, "int32")], ctx=ops.dtype(x),
                      summable=False)

    def decompress(self, ops, tensors: list, ctx, info: TensorInfo, out=None):
        values, indices = tensors
        total = ops.sparse_sum(info.numel, indices, ops.cast(values, "float32"))
        if ctx not in (None, "float32"):
            total = ops.cast(total, ctx)
        return ops.into(out, total)

    def decompress_gathered(self, ops, tensors: list, ctx, info: TensorInfo, world: int, out=None):
        # every rank's pairs side by side: one scatter-add of the concatenation sums them
        return self.decompress(ops, tensors, ctx, info, out)


class VariableHalfTopK(HalfTopK):
    """The same algorithm without the declaration: what the sharded reduce-scatter must refuse."""

    name = "halftopk_undeclared"   # not registered
    fixed_size_payload = False
