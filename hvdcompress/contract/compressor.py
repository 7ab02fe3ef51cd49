"""The compressor contract shared by every algorithm and every framework.

One step for one tensor ``x`` (flattened) on one rank::

    packet = compressor.compress(ops, x, state, info)      # payload tensors + ctx
    if packet.summable:  wire = [allreduce_sum(t) for t in packet.tensors]
                         total = compressor.decompress(ops, wire, packet.ctx, info)
    else:                wire = [allgather(t) for t in packet.tensors]
                         total = compressor.decompress_gathered(ops, wire, packet.ctx, info)
    grad = total / world   (op=Average)

``total`` is the sum over ranks of what each rank's payload stands for. ``packet.ctx`` never
leaves the rank. ``state`` is this tensor's own dict of buffers (residuals, momenta), created by
:meth:`Compressor.init_state` and stored with :meth:`Ops.write`, so the framework wrapper can
checkpoint it. Whether a packet is summable may change from step to step (DGC sends small
tensors and warm-up steps dense), but only as a function of the tensor's size, the step and the
configuration: every rank must make the same choice, or the collectives would not match.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..ops.facade import FLOAT_DTYPES, Ops, Tensor


@dataclass
class TensorInfo:
    """What a compressor may know about the tensor it compresses. Identical on every rank but
    for ``rank`` (this rank's index in the process set), which only random draws that must be
    independent across ranks may use; a collective's shape must never depend on it.

    ``momentum``, ``nesterov`` and ``weight_decay`` are the wrapped optimizer's settings for this
    tensor when the compressor took them over (see :attr:`Compressor.takes_over_momentum`).
    ``dense``: the wrapper asks for the tensor to be exchanged as it is this step (an allreduce,
    no compressor call), e.g. during :class:`hvdcompress.adam.frozen.FrozenAdam`'s warm-up; ``mild``:
    FrozenAdam sends it with its warm-up compressor (int8) this step (a small tensor's live Adam).
    """

    name: str
    numel: int
    world: int = 1
    shape: tuple = ()
    rank: int = 0
    param: Optional[Tensor] = None
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    dense: bool = False   # send this step's tensor uncompressed (FrozenAdam's warm-up)
    mild: bool = False    # send it with FrozenAdam's warm-up compressor (its live Adam steps)


@dataclass
class Packet:
    """A compressed tensor: ``tensors`` go on the wire, ``ctx`` stays on the rank.

    ``resume``: for algorithms that need more than one round of communication (PowerSGD sends
    P, then Q computed from the reduced P). When set, the wrapper communicates ``tensors``,
    calls ``resume(outputs)`` with what came back and communicates the packet it returns;
    the last packet (``resume=None``) is the one decompressed with its ``ctx``.
    """

    tensors: list
    ctx: Any = None
    summable: bool = False
    resume: Optional[Callable[[list], "Packet"]] = None


def payload_bytes(ops: Ops, tensors: list) -> int:
    """Bytes the tensors occupy on the wire (one rank's contribution)."""
    return sum(ops.numel(t) * ops.element_size(t) for t in tensors)


def decode_into(ops: Ops, out: Optional[Tensor], dtype: str,
                decode: Callable[[Optional[Tensor]], Tensor]) -> Tensor:
    """Run a float32 decoder ``decode(buffer)`` so that its result ends up in ``out`` (or in a
    new tensor when ``out`` is None) in ``dtype``: a float32 ``out`` is handed to the decoder to
    write into directly; any other is filled from the decoded float32 tensor."""
    direct = out if out is not None and ops.dtype(out) == "float32" else None
    return ops.into(out, ops.cast(decode(direct), dtype))


def check_float_tensor(ops: Ops, x: Tensor, info: TensorInfo) -> None:
    """Compressors accept floating-point gradients only: an integer gradient is a caller bug."""
    dt = ops.dtype(x)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"gradient of '{info.name}' has dtype {dt}; hvdcompress compresses only "
                        f"floating-point gradients ({', '.join(FLOAT_DTYPES)})")


@dataclass(frozen=True)
class AdamNeeds:
    """What the Adam take-over (:class:`hvdcompress.adam.frozen.FrozenAdam`) must know of an
    algorithm, declared by the algorithm; the take-over's rules read these, never class names.

    ``selects_by_magnitude``: what it keeps depends on each coordinate's magnitude (top-k), so
    its compressed steps send Adam's preconditioned step (the update's space). ``delivers_late``:
    it sends a fraction k of the coordinates a step, its error feedback holding the rest back
    for ~1/k steps (a sparsifier: top-k, random-k), so it needs longer live steps before v is
    kept, the first refreshes of v close after them, and a decaying lr
    (:mod:`hvdcompress.adam.variance`). ``wide``: it sends 16 bits or more per element, so its
    warm-up goes dense. ``long_warmup_ranks``: from this many ranks, where v forms slowly
    (b2 > 0.998), it needs the long warm-up sent int4; None: never.
    """

    selects_by_magnitude: bool = False
    delivers_late: bool = False
    wide: bool = False
    long_warmup_ranks: Optional[int] = None


class Compressor(ABC):
    """Base of every algorithm. Subclasses implement :meth:`compress` and :meth:`decompress`.

    Class attributes:
      name: the registry key.
      takes_over_momentum: the compressor applies momentum (and weight decay) itself, so the
        framework wrapper moves the optimizer's momentum / nesterov / weight_decay of the
        tensors it compresses into :class:`TensorInfo` and sets them to 0 in the optimizer.
      keeps_residual: the compressor keeps what it did not send (error feedback) for later steps.
      supports_alltoall: its per-rank payloads have a size fixed by the tensor's size and can be
        decoded, summed and compressed again, so the exchange may run the compressed allreduce
        (all-to-all of compressed segments, see :mod:`hvdcompress.transport.collectives`).
      fusable: the algorithm (:meth:`unwrap`) may compress a bucket of tensors as one flat
        tensor (``fusion=``, :mod:`hvdcompress.engines.fusion`); PowerSGD needs each tensor's shape.
      supports_warmup: the algorithm (:meth:`unwrap`) ramps its sparsity with a ``warmup``
        schedule and reports ``current_sparsity`` (:class:`hvdcompress.contract.schedule.SparsityWarmup`).
      fixed_size_payload: one round of payloads whose size is fixed by the tensor's size (so a
        chunk's payload can go to its rank in one all-to-all: the sharded reduce-scatter).
      summable_payload: every packet it makes is summable (an allreduce of payloads is a payload).
      takes_over_adam: the compressor steps Adam itself (:class:`hvdcompress.adam.frozen.FrozenAdam`).
      adam_needs: what the Adam take-over must know of the algorithm (:class:`AdamNeeds`).
      clip_norm: the local gradient clipping the algorithm applies itself (DGC's), or None.
      keeps_precision: every element travels with 8 bits or more of its value (none dropped or
        reduced to a sign or a few levels), so the error of one step stays small without error
        feedback (none, fp16, bf16, int8): what the sharded reduce-scatter holds well.

    The defaults are the safe ones: a new compressor runs on the flat exchange (allgather, or
    allreduce where its packets say so) until it declares more.
    """

    name: str = "abstract"
    takes_over_momentum: bool = False
    keeps_residual: bool = False
    supports_alltoall: bool = False
    fusable: bool = True
    supports_warmup: bool = False
    fixed_size_payload: bool = False
    summable_payload: bool = False
    takes_over_adam: bool = False
    adam_needs: AdamNeeds = AdamNeeds()
    clip_norm: Optional[float] = None
    keeps_precision: bool = False

    @property
    def explicit_momentum(self) -> Optional[float]:
        """The momentum coefficient μ given to this compressor itself, when it applies momentum
        (``takes_over_momentum``) with its own μ instead of the optimizer's; None otherwise.
        Wrappers refuse an explicit μ next to an optimizer momentum (it would apply twice)."""
        return None

    @property
    def carries_state(self) -> bool:
        """Whether what is exchanged is more than this step's gradient: the compressor applies
        the momentum itself or carries an error-feedback residual into later steps. Changing
        ``p.grad`` after the exchange (clipping it) is then a different algorithm."""
        return self.takes_over_momentum or self.keeps_residual

    # ---- per-tensor state ---------------------------------------------------------------------
    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        """Create this tensor's buffers in ``state`` (default: none)."""

    # ---- the algorithm --------------------------------------------------------------------------
    @abstractmethod
    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        """Compress the flat gradient ``x``; may update ``state``."""

    @abstractmethod
    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        """The dense flat tensor one payload stands for (or, for a summable payload that was
        allreduced, the sum over ranks), in the gradient's dtype.

        ``out``: an optional flat buffer of ``info.numel`` elements of the gradient's dtype
        (e.g. the gradient itself) that must not alias the payload. The result is written into
        it and it is returned, so a framework wrapper can decode without allocating (the
        kernels write float32 results straight into it)."""

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        """Sum over ranks of the dense tensors that the allgathered payloads stand for
        (``out`` as for :meth:`decompress`).

        Default: every rank's payload tensors have equal length; split them into ``world``
        pieces, decompress each, add. Sparse formats override this with one scatter-add.
        """
        pieces = [ops.split(t, [ops.numel(t) // world] * world) for t in tensors]
        total = None
        for r in range(world):
            dense = self.decompress(ops, [p[r] for p in pieces], ctx, info)
            total = dense if total is None else total + dense
        return ops.into(out, total)

    def unwrap(self) -> "Compressor":
        """The algorithm under any decorators (error feedback, momentum): itself here."""
        return self

    def with_algorithm(self, algorithm: "Compressor") -> "Compressor":
        """This compressor with :meth:`unwrap`'s algorithm replaced by ``algorithm`` (decorators
        copied, this object unchanged): ``algorithm`` itself here."""
        return algorithm

    def for_adam(self) -> "Compressor":
        """The algorithm as the Adam take-over runs it (default: itself); an algorithm that
        needs other settings there returns a configured copy, never changing itself."""
        return self

    def server_side(self) -> "Compressor":
        """The compressor that re-compresses a summed segment in the compressed allreduce: this
        one, without momentum (already applied to the gradients); error feedback stays."""
        return self

    # ---- compressor-wide state (schedules) -------------------------------------------------------
    def on_step(self) -> None:
        """Called by the framework wrapper once per optimizer step, after communication."""

    def set_epoch(self, epoch: int) -> None:
        """Called by warm-up helpers at the start of each epoch."""

    def state_dict(self) -> dict:
        """Compressor-wide state to checkpoint (per-tensor state is kept by the wrapper)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def arguments(self) -> dict:
        """This compressor's own constructor arguments, not those of a compressor it wraps
        (default: its public attributes that are not compressors)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and not isinstance(v, Compressor)}

    def wrapped(self) -> tuple:
        """The compressors this one wraps (a decorator's ``inner``): none here."""
        return ()

    def config(self) -> dict:
        """The arguments of the whole tree, flat, in the registry's terms (a decorator's next to
        those of what it wraps), for logs."""
        return self.arguments()

    def __repr__(self) -> str:
        """The whole tree, canonical: the class, each wrapped compressor's repr, then this one's
        :meth:`arguments`, e.g. ``ErrorFeedback(FP16(), ef='vanilla')``. Two compressors have the
        same repr exactly when every node has the same class and arguments, so the rank
        agreement (:mod:`hvdcompress.step.agreement`) and the checkpoint check
        (:mod:`hvdcompress.state.store`) compare it."""
        parts = [repr(c) for c in self.wrapped()] + [f"{k}={v!r}" for k, v in self.arguments().items()]
        return f"{type(self).__name__}({', '.join(parts)})"
