"""Engines: how one step's compressed payloads travel. The flat exchange (allreduce or allgather
per tensor, or the compressed allreduce), the two-level composer (inside the node, then between
nodes), the reduce-scatter for sharded training, fusion of small tensors and byte accounting.

Owns: compress, start, finish, step bytes and per-tensor exchange state. May import:
:mod:`hvdcompress.ops`, :mod:`hvdcompress.contract`, :mod:`hvdcompress.compressors`,
:mod:`hvdcompress.transport`, :mod:`hvdcompress.state`.
"""
