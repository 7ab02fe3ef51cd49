"""The torch front ends' side of fused compression (:mod:`hvdcompress.engines.fusion`): the parameters
that may share a bucket, for the Horovod optimizer and the DDP hook alike."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence


def bucket_tensors(named: Iterable[tuple], param_groups: Sequence[Mapping]) -> list:
    """``(name, numel, bytes, key)`` of every trainable parameter of ``named`` (``(name,
    parameter)`` pairs, any order: the buckets are cut in name order) for
    :meth:`hvdcompress.step.options.Options.buckets`. The key, the dtype and the index of the
    parameter's param group (None outside them), keeps a bucket within one group: one momentum,
    weight decay and Adam settings for a take-over."""
    group = {p: i for i, g in enumerate(param_groups) for p in g["params"]}
    return [(name, p.numel(), p.numel() * p.element_size(), (str(p.dtype), group.get(p)))
            for name, p in named if p.requires_grad]
