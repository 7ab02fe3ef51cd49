"""Byte accounting: what a rank would send dense versus what its compressed payloads send."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ByteCount:
    """Bytes of one rank's gradients for one step (or a running total).

    ``dense``: what the uncompressed gradients occupy (what Horovod's allreduce would carry);
    ``sent``: what the compressed payloads occupy. Both count this rank's contribution once;
    the wire traffic of a ring allreduce or an allgather is a multiple of it that depends on
    the collective and the number of ranks.
    """

    dense: int = 0
    sent: int = 0
    steps: int = 0

    def add(self, dense: int, sent: int) -> None:
        self.dense += dense
        self.sent += sent

    def merge(self, step: "ByteCount") -> None:
        """Add a finished step (or any other count) to this running total."""
        self.dense += step.dense
        self.sent += step.sent
        self.steps += step.steps

    def plus(self, other: "ByteCount") -> "ByteCount":
        """A new count: this one's bytes and steps, with ``other``'s bytes added (another collective's)."""
        return ByteCount(self.dense + other.dense, self.sent + other.sent, self.steps)

    @property
    def ratio(self) -> float:
        """Compression ratio dense / sent (inf when nothing was sent)."""
        return self.dense / self.sent if self.sent else float("inf")

    def as_dict(self) -> dict:
        return {"dense": self.dense, "sent": self.sent, "steps": self.steps, "ratio": self.ratio}
