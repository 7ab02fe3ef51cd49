"""The algorithms, one a file: each a :class:`~hvdcompress.contract.compressor.Compressor` that
declares what it can do (its capabilities) and is registered by name in :mod:`hvdcompress`.
Shared pieces: :mod:`.payload` (sparse payloads), :mod:`.quant` (quantiser helpers),
:mod:`.sparse`, :mod:`.density`, :mod:`.residual`.

Owns: the compression rules. May import: :mod:`hvdcompress.ops`, :mod:`hvdcompress.contract`.
"""
