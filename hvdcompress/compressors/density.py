"""How many elements a sparsifier sends: ``k`` as a fraction of the tensor or a count, shared by
top-k, random-k, DGC and CSC."""
from __future__ import annotations

import math
from typing import Union

from ..contract.validation import check_int, check_range, is_integer


def resolve_k(k: Union[int, float], numel: int) -> int:
    """Number of elements to send for a tensor of ``numel`` elements (at least 1).

    A fraction is rounded up after rounding away float noise: 1 - 0.99 of 1000 is 10, not 11.
    """
    if isinstance(k, int):
        return min(k, numel)
    return min(numel, max(1, math.ceil(round(k * numel, 6))))


def check_k(owner: str, k: Union[int, float]) -> Union[int, float]:
    """``k`` checked: an int >= 1 (a count) or a float in (0, 1] (a fraction)."""
    if is_integer(k):
        return check_int(owner, "k", k, 1)
    return check_range(owner, "k", k, 0.0, 1.0, low_open=True)
