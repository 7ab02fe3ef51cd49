"""The compressor contract: :class:`~hvdcompress.contract.compressor.Compressor` and its
:class:`~hvdcompress.contract.compressor.Packet`, the error-feedback and momentum decorators
(:mod:`~hvdcompress.contract.memory`), sparsity schedules, the string keys of the registry and
the validation helpers every constructor uses.

Owns: what a compressor is and what it declares. May import: :mod:`hvdcompress.ops` only.
"""
