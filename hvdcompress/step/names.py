"""Tensor names: the key of every per-tensor state and the order of every loop over tensors.

Every front end names its tensors once, from the user's ``(name, tensor)`` pairs
(``model.named_parameters()``), and sorts by name wherever a loop spans several tensors (norms,
groups, launches, checksums), so that every rank runs it in the same order.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional, Sequence


def check_names(named: Optional[Iterable], params: Optional[Sequence[Any]] = None) -> dict:
    """tensor -> name (tensors keyed by identity), from unique ``(name, tensor)`` pairs.

    ``params``: the tensors that must all be named (an optimizer's); with ``named=None`` they
    are named ``allreduce.noname.<i>`` in order, as Horovod does. A ``ValueError`` names what is
    wrong: not pairs, an exhausted iterator, duplicate names, a tensor under two names, or
    tensors of ``params`` missing from ``named``."""
    if named is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params or ())}
    once = iter(named) is named   # a generator: model.named_parameters() is one
    named = list(named)
    if once and not named:
        raise ValueError("named_parameters is an exhausted iterator (model.named_parameters() "
                         "can be iterated once, and was already); pass "
                         "list(model.named_parameters())")
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually produced by model.named_parameters()")
    dups = sorted(n for n, c in Counter(n for n, _ in named).items() if c > 1)
    if dups:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(dups)}")
    by_id: dict = {}
    for n, p in named:
        if by_id.setdefault(id(p), n) != n:
            raise ValueError(f"named_parameters names one tensor both {by_id[id(p)]!r} and {n!r} "
                             "(its state is keyed by one name); allowed: each tensor once")
    if params is None:
        return {p: n for n, p in named}
    unnamed = [p for p in params if id(p) not in by_id]
    if unnamed:
        raise ValueError(f"named_parameters was given, but {len(unnamed)} optimizer parameter(s) "
                         f"are not in it (shapes: {[tuple(p.shape) for p in unnamed]})"
                         + ("; it is an iterator, which may have been partly consumed: pass "
                            "list(model.named_parameters())" if once else ""))
    return {p: by_id[id(p)] for p in params}
