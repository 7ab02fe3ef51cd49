"""Fused compression (Cupcake, Wang et al., MLSys 2023): a bucket of gradients compressed as one.

With ``fusion=B`` (bytes), the tensors a wrapper exchanges are cut, in name order, into buckets
of consecutive tensors of at most ``B`` bytes that share a dtype and a *fusion key* (the param
group: the momentum, weight decay and Adam settings a take-over applies). Each bucket of two
or more tensors is concatenated into one flat buffer, compressed once, sent in one collective
per round, decoded once, and cut back into its tensors::

    flat = concat(x_1, ..., x_n)                 # n tensors of one bucket, in name order
    packet = C(flat)                             # one codec call, one state (residual) per bucket
    total = D(allreduce or allgather(packet))    # one collective per round
    total_1, ..., total_n = split(total)         # views, copied into each gradient

**Trade-off.** Per step, collectives and codec calls count buckets, not tensors: a model of
hundreds of small tensors (biases, norms) pays each collective's latency (alpha: Horovod's
negotiation, the ring's 2(P-1) steps) and each codec call's fixed cost once per bucket, and
a sparsifier's indices or a quantiser's scale once per bucket. The price:

* one copy in (the concatenation) and one out (the split), each the bucket's size;
* a statistic the compressor keeps per tensor is then one per bucket: onebit's scale
  mean|g| and terngrad's max span layers of different magnitudes, top-k picks its k over the
  bucket (global, not layer-wise, selection), as DeepSpeed's 1-bit Adam does over the whole
  model; per-chunk codecs (int8, fp16, bf16) are unchanged;
* a bucket is sent when its last tensor's gradient is ready, not each tensor as it comes
  (smaller ``B`` keeps more overlap with the backward pass);
* the state (residuals, momenta) is kept per bucket, under the bucket's name
  (:attr:`Bucket.name`), so a checkpoint resumes with the same ``fusion``.

PowerSGD refuses it (its factors need each tensor's matrix shape: ``fusable = False``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Optional, Sequence

from ..contract.compressor import Compressor, TensorInfo
from ..contract.validation import is_integer
from ..ops.facade import Ops

#: Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD): ``fusion=True`` takes it
DEFAULT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Bucket:
    """Tensors compressed as one: ``members`` (names, in name order) of ``sizes`` elements."""

    members: tuple
    sizes: tuple

    @property
    def name(self) -> str:
        """The bucket's state key: its first and last member, e.g. ``fused[a.bias..b.weight]``."""
        return f"fused[{self.members[0]}..{self.members[-1]}]"

    @property
    def numel(self) -> int:
        return sum(self.sizes)


class FusedKey(NamedTuple):
    """The key of a fused :class:`hvdcompress.engines.exchange.Entry`: its members' wrapper keys."""

    keys: tuple
    sizes: tuple


def check_fusion(fusion: Any, compressor: Compressor, groups: Any = None) -> Optional[int]:
    """The ``fusion`` argument as a byte threshold (None: off); a ValueError naming what is
    allowed for anything else, for a compressor that cannot fuse, or next to ``groups``."""
    if fusion is None or fusion is False or fusion == 0:
        return None
    given, fusion = fusion, DEFAULT_BYTES if fusion is True else fusion
    if not is_integer(fusion) or fusion < 0:
        raise ValueError(f"fusion={fusion!r}: allowed: None or False (each tensor compressed alone), "
                         f"True ({DEFAULT_BYTES} bytes, Horovod's fusion buffer) or a number of bytes "
                         ">= 1 per fused buffer")
    if not compressor.unwrap().fusable:
        raise ValueError(f"fusion={given!r} with {compressor!r}: {compressor.unwrap().name} needs each "
                         "tensor's own shape (PowerSGD's low-rank factors of each matrix); use "
                         "fusion=None")
    if groups is not None:
        raise ValueError(f"fusion={given!r} with groups={groups!r}: both decide which tensors travel "
                         "together; pass one of them")
    return int(fusion)


def buckets(tensors: Sequence[tuple], threshold: int) -> list:
    """The buckets of two or more tensors for ``tensors`` = ``(name, numel, bytes, key)``: in
    name order, consecutive tensors of one ``key`` (dtype and param group, hashable)
    while their bytes stay within ``threshold``; a tensor alone (larger than the threshold, or
    the only one of its key in a row) is not fused. Empty tensors are never fused. The same on
    every rank: it depends only on names, sizes and keys."""
    out, run, run_bytes, run_key = [], [], 0, None

    def close() -> None:
        if len(run) >= 2:
            out.append(Bucket(tuple(n for n, _ in run), tuple(s for _, s in run)))

    for name, numel, nbytes, key in sorted(tensors, key=lambda t: t[0]):
        if not numel:
            continue
        if run and (key != run_key or run_bytes + nbytes > threshold):
            close()
            run, run_bytes = [], 0
        run.append((name, numel))
        run_bytes, run_key = run_bytes + nbytes, key
    close()
    return out


def bucket_info(bucket: Bucket, infos: Sequence[TensorInfo], ops: Ops) -> TensorInfo:
    """The :class:`TensorInfo` of a bucket from its members' (in member order): a flat tensor;
    the take-over settings and ``dense`` are the members' (one param group, so the same), the
    parameter their concatenation where a take-over's weight decay reads it (a copy per step),
    else None."""
    first = infos[0]
    mixed = [f for f in ("momentum", "nesterov", "weight_decay", "dense", "mild")
             if any(getattr(i, f) != getattr(first, f) for i in infos)]
    if mixed:
        raise ValueError(f"fused bucket {bucket.name}: its tensors differ in {mixed}; a bucket holds "
                         "tensors of one param group (this is a bug in the bucket's key)")
    params = [i.param for i in infos]
    param = ops.concat(params) if first.weight_decay and all(p is not None for p in params) else None
    return TensorInfo(name=bucket.name, numel=bucket.numel, world=first.world, shape=(bucket.numel,),
                      rank=first.rank, param=param, momentum=first.momentum, nesterov=first.nesterov,
                      weight_decay=first.weight_decay, dense=first.dense, mild=first.mild)


def compress_bucket(engine: Any, bucket: Bucket, items: Sequence[tuple], state: Any) -> Any:
    """Compress a bucket as one tensor through ``engine`` (:class:`hvdcompress.engines.exchange.Exchange`):
    ``items`` = ``(key, x, info)`` of every member (any order); returns the fused entry, whose
    key is a :class:`FusedKey` (see :func:`totals`)."""
    by_name = {info.name: (key, x, info) for key, x, info in items}
    if sorted(by_name) != list(bucket.members):
        missing = sorted(set(bucket.members) - set(by_name))
        raise ValueError(f"fused bucket {bucket.name}: got tensors {sorted(by_name)}, expected "
                         f"{list(bucket.members)} (missing {missing}): every tensor of a bucket is "
                         "exchanged dense each step; a sparse gradient needs sparse_as_dense=True")
    ordered = [by_name[name] for name in bucket.members]
    flat = engine.ops.concat([x for _, x, _ in ordered])
    info = bucket_info(bucket, [i for _, _, i in ordered], engine.ops)
    return engine.compress(FusedKey(tuple(k for k, _, _ in ordered), bucket.sizes), flat, state, info)


def totals(ops: Ops, entry: Any) -> Iterator[tuple]:
    """``(key, total)`` of each tensor of a finished entry: a fused one's total cut into its
    members' (views of it); any other entry's own."""
    if not isinstance(entry.key, FusedKey):
        yield entry.key, entry.total
        return
    yield from zip(entry.key.keys, ops.split(entry.total, list(entry.key.sizes)))

