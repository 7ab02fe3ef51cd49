"""The keyword arguments every front end shares, documented once.

Each front end (``hvdcompress.torch.DistributedOptimizer``, ``hvdcompress.torch.ddp.CompressionState``,
``hvdcompress.tensorflow.DistributedGradientTape``, ``hvdcompress.tensorflow.keras.DistributedOptimizer``)
takes Horovod's arguments plus these; :func:`documented` appends their text to the front end's
docstring, so ``help()`` shows them where users look, from this one source. They are checked
and parsed once, by :func:`hvdcompress.step.options.parse_options`.
"""
from __future__ import annotations

from typing import Callable

ARGUMENTS = {
    "compression": """an hvdcompress :class:`~hvdcompress.Compressor`, a dict for
    :func:`hvdcompress.from_params` (``{"compressor": "topk", "k": "0.01", "ef": "vanilla"}``),
    or ``"auto"`` (below); None: no compression, a plain averaged exchange. Horovod's own
    ``hvd.Compression.none`` and ``hvd.Compression.fp16``, left in place by a migration, are
    ``NoCompression()`` and ``FP16()`` (:func:`hvdcompress.registry.as_compressor`).""",
    "clip_grad_norm": """``c``: the way to clip gradients with compression
    (:mod:`hvdcompress.step.clipping`). With a compressor that owns the momentum or keeps a residual
    (DGC, CSC, error feedback, PowerSGD, ``Momentum``), each rank clips its own local gradients
    (all of them, after ``backward_passes_per_step`` accumulations) by their global L2 norm,
    before error feedback and compression: the local gradient clipping of the DGC paper (Lin et
    al. 2018, sec. 3.3), ``c * sqrt(N)`` on each rank's gradient with op=Average (``c / sqrt(N)``
    with op=Sum); compression then waits for the last gradient of the step. With a stateless
    compressor, and in FrozenAdam's v-steps, the exchanged gradients are clipped to ``c`` after
    the exchange: exactly Horovod's ``clip_grad_norm_`` after ``synchronize()``; FrozenAdam's
    compressed steps scale each rank's gradients by the last v-step's clip coefficient first.""",
    "collective": """how payloads that cannot be summed travel: ``"auto"`` (default: the
    compressed allreduce for the quantisers at 3 ranks or more, where it sends 2(P-1)/P of a
    payload instead of the allgather's P-1; allgather otherwise), ``"allgather"`` or
    ``"alltoall"`` (a ValueError for a compressor that cannot run it). See
    :mod:`hvdcompress.transport.collectives`; rank 0 logs the plan once.""",
    "intra_node": """two-level compression (:mod:`hvdcompress.engines.two_level`). None (default): the
    flat exchange. A mild compressor (``NoCompression()``, ``FP16()``, ``BF16()``, ``Int8()``):
    each node reduce-scatters the gradients with it, each local rank exchanges its shard between
    nodes with ``compression``, and the node all-gathers the result: inter-node bytes divide by
    the ranks per node. ``ranks_per_node`` (default: the framework's local size) must divide the
    world size. The byte counts then count the bytes sent between nodes.""",
    "check_replicas": """``N``: every N-th step, compare a 64-bit checksum of every
    parameter's bits and of the compressor's step counters across ranks (one allgather of 8
    bytes per parameter) and raise :class:`hvdcompress.ReplicaMismatch` on every rank, naming
    the first differing parameter, the step and which ranks disagree. Default: the environment
    variable ``HVDCOMPRESS_CHECK_REPLICAS``, else off (:mod:`hvdcompress.step.replicas`).""",
    "auto": """``compression="auto"``: per tensor, the compressor and collective the cost model
    predicts fastest, from ``auto_allowed`` (default the accuracy-safe none, fp16, bf16, int8),
    on the link measured at the first exchange or given as ``link=`` (e.g.
    ``{"bandwidth": "10gbit", "latency": "50us"}``); see :mod:`hvdcompress.auto`, docs/auto.md.""",
    "scaler": """the loss scaler of mixed-precision training (torch: ``torch.amp.GradScaler``;
    Keras: a ``LossScaleOptimizer``). Each gradient is divided by the current loss scale before
    compression, so residuals, momenta and factors hold unscaled gradients and the result does
    not depend on the scale; a step on which any rank's gradients hold an inf/NaN leaves the
    compressor state exactly as before and is skipped on every rank, and the scaler lowers its
    scale on every rank alike (torch: ``scaler.scale(loss).backward(); scaler.step(opt);
    scaler.update()``, without ``scaler.unscale_(opt)``). Costs: a copy of the compressor state
    per step, one allreduce of one number (:mod:`hvdcompress.step.loss_scale`, docs/mixed_precision.md).""",
    "fusion": """``B``: fused compression (:mod:`hvdcompress.engines.fusion`): consecutive tensors in
    name order, of one dtype and param group, up to ``B`` bytes (``True``: 64 MiB, Horovod's
    fusion buffer), are compressed as one flat buffer and sent in one collective per round; a
    bucket is sent once its last gradient is ready; its state is kept under the bucket's name
    (``fused[first..last]``). Not with ``groups`` or PowerSGD.""",
    "bytes": """``total_bytes`` / ``last_step_bytes``: this rank's dense versus sent gradient
    bytes since construction / of the last step (:class:`hvdcompress.engines.accounting.ByteCount`).""",
}


def documented(*names: str) -> Callable:
    """Append the shared documentation of ``names`` (keys of :data:`ARGUMENTS`) to the
    decorated function's or class's docstring."""
    def decorate(obj):
        text = "\n\n".join(f"    ``{name}``: {ARGUMENTS[name]}" for name in names)
        obj.__doc__ = f"{(obj.__doc__ or '').rstrip()}\n\n    Shared arguments (:mod:`hvdcompress.step.arguments`):\n\n{text}\n"
        return obj
    return decorate
