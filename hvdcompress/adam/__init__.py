"""The Adam take-over (1-bit Adam / 0-1 Adam style): :class:`~hvdcompress.adam.frozen.FrozenAdam`
steps Adam itself with compressed momentum, :mod:`~hvdcompress.adam.variance` decides when the
variance is refreshed, :mod:`~hvdcompress.adam.settings` reads the wrapped optimizer's settings.

Owns: Adam-class optimisation on compressed exchanges. May import: :mod:`hvdcompress.ops`,
:mod:`hvdcompress.contract`, :mod:`hvdcompress.compressors`.
"""
from .frozen import FrozenAdam

__all__ = ["FrozenAdam"]
