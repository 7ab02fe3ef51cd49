"""A view of a tensor's state dict under a key prefix, so that one tensor's state can hold
several compressors' (the compressed allreduce's segments, ``seg<j>.`` and ``sum.``; the
two-level exchange's shard, ``cross.``; ``auto``'s per-compressor states, ``<label>/``), and
checkpoints keep them all."""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Iterator


class PrefixedState(MutableMapping):
    """A view of a tensor's state dict under a key prefix: the state of one segment of the
    compressed allreduce lives in the tensor's own state (so checkpoints keep it)."""

    def __init__(self, parent: MutableMapping, prefix: str):
        self.parent, self.prefix = parent, prefix

    def __getitem__(self, key: str) -> Any:
        return self.parent[self.prefix + key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.parent[self.prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self.parent[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return iter([k[n:] for k in list(self.parent) if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for _ in self)
