"""The array operations a framework provides to the core.

Every algorithm in :mod:`hvdcompress.compressors` is written once, against this small
interface, and runs unchanged on PyTorch tensors (:mod:`hvdcompress.torch.backend`) and TensorFlow
tensors (:mod:`hvdcompress.tensorflow.backend`). Tensors are opaque to the core: it only passes them
to these methods and combines them with ``+``, ``-``, ``*`` and ``/``.

State (residuals, momenta) lives in a plain ``dict`` per tensor; a backend decides how a value is
stored (:meth:`Ops.write`): in place for torch, ``tf.Variable.assign`` for TensorFlow, so the
same algorithm code is checkpointable in both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

Tensor = Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class Ops(ABC):
    """Framework array operations on flat (1-D) tensors. Indices are int64 unless stated."""

    name: str = "abstract"

    # --- introspection -------------------------------------------------------------------
    @abstractmethod
    def numel(self, x: Tensor) -> int: ...

    @abstractmethod
    def dtype(self, x: Tensor) -> str:
        """The dtype as a numpy-style name: 'float32', 'float16', 'int64', ..."""

    @abstractmethod
    def element_size(self, x: Tensor) -> int: ...

    # --- creation and conversion ---------------------------------------------------------
    @abstractmethod
    def zeros(self, n: int, like: Tensor, dtype: str | None = None) -> Tensor: ...

    @abstractmethod
    def cast(self, x: Tensor, dtype: str) -> Tensor: ...

    @abstractmethod
    def bitcast(self, x: Tensor, dtype: str) -> Tensor:
        """The same bytes read as ``dtype`` of the same width (e.g. bfloat16 <-> int16)."""

    @abstractmethod
    def from_numpy(self, a: Any, like: Tensor) -> Tensor:
        """A tensor on ``like``'s device holding the numpy array ``a`` (dtype kept)."""

    @abstractmethod
    def scalar(self, x: Tensor) -> float:
        """A 0-d or 1-element tensor as a Python float (synchronises with the device)."""

    # --- elementwise and reductions ------------------------------------------------------
    @abstractmethod
    def abs(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def magnitude(self, x: Tensor) -> Tensor:
        """``|x|`` with NaN mapped to +inf, so selection by magnitude always picks non-finite
        elements and they reach every rank, as they would with a dense allreduce."""

    @abstractmethod
    def sign(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def where(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor: ...

    @abstractmethod
    def isfinite(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def ge(self, x: Tensor, threshold: Tensor) -> Tensor: ...

    @abstractmethod
    def norm(self, x: Tensor) -> Tensor:
        """The L2 norm as a 0-d tensor, accumulated in float32 or wider."""

    @abstractmethod
    def min(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def count(self, mask: Tensor) -> int:
        """Number of true elements of a boolean tensor, as a Python int."""

    # --- selection ------------------------------------------------------------------------
    @abstractmethod
    def topk_indices(self, x: Tensor, k: int) -> Tensor:
        """Indices of the ``k`` largest elements of ``x`` (NaN counts as largest), ascending."""

    @abstractmethod
    def topk_values(self, x: Tensor, k: int) -> Tensor:
        """The ``k`` largest values of ``x``, in any order."""

    @abstractmethod
    def nonzero(self, mask: Tensor) -> Tensor:
        """Ascending int64 indices of the true elements of a boolean tensor."""

    @abstractmethod
    def gather(self, x: Tensor, indices: Tensor) -> Tensor: ...

    @abstractmethod
    def strided(self, x: Tensor, start: int, stride: int) -> Tensor:
        """``x[start::stride]``."""

    @abstractmethod
    def scatter_add(self, n: int, indices: Tensor, values: Tensor) -> Tensor:
        """A dense length-``n`` tensor: zeros, plus ``values`` added at ``indices`` (repeats sum)."""

    @abstractmethod
    def fill_at(self, x: Tensor, indices: Tensor, value: float) -> Tensor:
        """``x`` with ``x[indices] = value``; may work in place and return ``x``."""

    @abstractmethod
    def concat(self, xs: Sequence[Tensor]) -> Tensor: ...

    @abstractmethod
    def split(self, x: Tensor, sizes: Sequence[int]) -> list: ...

    # --- state ------------------------------------------------------------------------------
    @abstractmethod
    def write(self, state: dict, key: str, value: Tensor) -> None:
        """Store ``value`` as ``state[key]``, reusing the existing buffer where there is one."""
