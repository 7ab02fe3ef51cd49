"""Transport: the collectives a front end adapts (:class:`~hvdcompress.transport.collectives.Collectives`),
multi-round exchanges, process sets and node layout, bounded waiting, the exit guard, and
gathering small Python objects from every rank.

Owns: moving payloads between ranks. May import: :mod:`hvdcompress.ops`, :mod:`hvdcompress.contract`.
"""
