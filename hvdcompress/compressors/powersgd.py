"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r approximation by one step of power iteration,
with error feedback and warm start.

A gradient of shape (rows, ...) is viewed as a matrix M (rows × cols) plus the residual e::

    M ← M + e
    P ← M Q                      round 1: allreduce (sum) P        (rows × r)
    P̂ ← orthonormalise(ΣP)
    Q ← Mᵀ P̂                     round 2: allreduce (sum) Q        (cols × r)
    e ← M − P̂ Qᵀ;   result: P̂ (ΣQ)ᵀ = Σ over ranks of P̂ P̂ᵀ M_r

Both rounds are allreduced (the factors are linear in M), so the cost per rank is
``r·(rows + cols)`` floats whatever the number of ranks, against ``rows·cols``. Biased, hence
the built-in residual (do not wrap it in ErrorFeedback). Warm start reuses the last ΣQ as the
next Q, so the approximation improves across steps like a power iteration; otherwise Q is drawn
afresh each step. Tensors of fewer than 2 dimensions, and those where the factors would not be
smaller than the tensor, are sent dense (allreduced). Costs two small matrix products per step
and two buffers (residual, Q) per tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..contract.compressor import AdamNeeds, Compressor, Packet, TensorInfo
from ..contract.keys import advance_step, generator, tensor_id
from ..contract.validation import check_bool, check_int
from ..ops.facade import Ops, Tensor
from .payload import as_float32, check_payload
from .residual import RESIDUAL, OwnResidual

WARM_Q = "powersgd_q"


@dataclass
class _Factors:
    """What the second round's decompression needs (stays on the rank)."""

    p_hat: Tensor
    cols: int
    dtype: str
    state: dict


class PowerSGD(OwnResidual, Compressor):
    """Rank-``rank`` PowerSGD with error feedback; ``warm_start`` reuses Q across steps."""

    name = "powersgd"
    adam_needs = AdamNeeds(long_warmup_ranks=1)
    fusable = False   # its factors need each tensor's matrix shape

    def __init__(self, rank: int = 1, warm_start: bool = True, seed: int = 0):
        self.rank = check_int("PowerSGD", "rank", rank, 1)
        self.warm_start = check_bool("PowerSGD", "warm_start", warm_start)
        self.seed = check_int("PowerSGD", "seed", seed, 0)

    def _matrix_shape(self, info: TensorInfo):
        """(rows, cols) when the tensor is compressed, else None (sent dense)."""
        if len(info.shape) < 2 or info.numel == 0:
            return None
        rows = int(info.shape[0])
        cols = info.numel // rows
        return (rows, cols) if self.rank * (rows + cols) < info.numel else None

    def _initial_q(self, ops: Ops, state: dict, info: TensorInfo, cols: int, like: Tensor) -> Tensor:
        step = advance_step(state)
        if self.warm_start and WARM_Q in state:
            return ops.reshape(state[WARM_Q], (cols, self.rank))
        stream = [self.seed, tensor_id(info.name)] + ([] if self.warm_start else [step])
        q = generator(*stream).standard_normal((cols, self.rank)).astype(np.float32)
        return ops.from_numpy(q, like)

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        if self._matrix_shape(info) is not None:
            super().init_state(ops, x, state, info)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        x32, dtype = as_float32(ops, x, info)
        shape = self._matrix_shape(info)
        if shape is None:
            return Packet([x], None, summable=True)
        rows, cols = shape
        e = ops.reshape(self.residual(state), (rows, cols))
        q0 = self._initial_q(ops, state, info, cols, x32)
        m, p = ops.lowrank_project(e, ops.reshape(x32, (rows, cols)), q0)  # M = e + g, P = M Q
        ops.write(state, RESIDUAL, ops.reshape(m, (info.numel,)))

        def second_round(outputs: list) -> Packet:
            check_payload(ops, self.name, "P", outputs[0], "float32", rows * self.rank)
            p_hat = ops.orthonormalize(ops.reshape(outputs[0], (rows, self.rank)))
            q = ops.lowrank_project_back(m, p_hat)
            ops.write(state, RESIDUAL, ops.lowrank_residual(m, p_hat, q))  # e = M - P̂ Qᵀ
            return Packet([ops.reshape(q, (cols * self.rank,))], _Factors(p_hat, cols, dtype, state),
                          summable=True)

        return Packet([ops.reshape(p, (rows * self.rank,))], None, summable=True, resume=second_round)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        if not isinstance(ctx, _Factors):  # sent dense
            return ops.into(out, tensors[0])
        check_payload(ops, self.name, "Q", tensors[0], "float32", ctx.cols * self.rank)
        q = ops.reshape(tensors[0], (ctx.cols, self.rank))
        if self.warm_start:
            ops.write(ctx.state, WARM_Q, tensors[0])
        if out is not None:
            return ops.matmul(ctx.p_hat, q, transpose_b=True, out=out)
        return ops.cast(ops.reshape(ops.matmul(ctx.p_hat, q, transpose_b=True), (info.numel,)), ctx.dtype)
