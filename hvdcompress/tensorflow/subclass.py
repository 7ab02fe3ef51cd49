"""Wrapping by subclassing, as Horovod does: the wrapper is an instance of the wrapped object's
own class (so ``isinstance`` checks and Keras serialisation keep working) with a few methods
replaced."""
from __future__ import annotations


def subclass_with(base: type, mixin: type) -> type:
    """A subclass of ``base``, named like it, with ``mixin``'s methods and properties."""
    members = {k: v for k, v in vars(mixin).items() if k not in ("__dict__", "__weakref__")}
    return type(base.__name__, (base,), members)
