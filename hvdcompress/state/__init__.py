"""State: the per-tensor state store behind every front end's ``state_dict`` (save, gather,
load), resharding of per-rank state to another world size, the re-layout of an
HSDP run's state to another number of shards (:mod:`.mesh`), and prefixed state of nested parts.

Owns: checkpoints of the compression state. May import: :mod:`hvdcompress.ops`,
:mod:`hvdcompress.contract`, :mod:`hvdcompress.transport`.
"""
