"""The methods of :class:`hvdcompress.ops.facade.Ops` generated from the kernel table
(hvdcompress/ops/table.py): for each kernel, the arguments checked by their roles, then the
kernel implementation that ``Ops._impl`` picks for the first tensor called with them. Ops lists
the kernels whose methods it writes out instead (``WRITTEN``)."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from . import roles, table


def kernel_method(kernel: table.Kernel) -> Callable:
    """The checked Ops method of ``kernel`` (hvdcompress/ops/table.py): the kernel's parameters
    less its in-place outputs (``Into``), each checked by its role, then
    ``self._impl(first tensor).<kernel>(...)``, with a scalar as :meth:`Ops._scalar_arg` makes
    it, an ``Into`` buffer as :meth:`Ops._in_place` says and an ``Out`` one as
    :meth:`Ops._decode` does."""
    params = tuple(p for p in kernel.params if not isinstance(p.role, roles.Into))
    first = next(p.name for p in kernel.params if p.role.tensor)
    out = next((p.name for p in params if isinstance(p.role, roles.Out)), None)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        env = kernel.bind(args, kwargs, params)
        for p in kernel.order:
            if not isinstance(p.role, roles.Out) and (env[p.name] is not None or p.default is not None):
                env[p.name] = p.role.check(self, kernel.name, p.name, env[p.name], env)
        impl = self._impl(env[first])

        def call(buf: Any) -> Any:
            return getattr(impl, kernel.name)(*(_argument(self, impl, p, env, buf) for p in kernel.params))
        return call(None) if out is None else self._decode(env[out], env["n"], call)

    method.__name__ = method.__qualname__ = kernel.name
    method.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default)
           for p in params])
    method.__doc__ = (f"{kernel.doc} (kernels.h ``{kernel.name}``).\n\nDeclared in "
                      f"hvdcompress/ops/table.py: ``{kernel.name}({kernel.declaration})``.")
    return method


def _argument(ops: Any, impl: Any, param: table.Param, env: dict, buf: Any) -> Any:
    """The checked argument of ``param`` as the kernel implementation ``impl`` takes it."""
    if isinstance(param.role, roles.Into):
        target = env[param.role.target]
        return None if target is None else ops._in_place(target)
    if isinstance(param.role, roles.Out):
        return buf
    if isinstance(param.role, roles.Scalar):
        return ops._scalar_arg(impl, env[param.name])
    return env[param.name]


def add_kernel_methods(cls: type, written: Sequence[str]) -> None:
    """A generated method on ``cls`` (:class:`hvdcompress.ops.facade.Ops`) for every kernel not in
    ``written``; TypeError when ``cls`` writes one of them by hand."""
    for name, kernel in table.KERNELS.items():
        if name in written:
            continue
        if name in vars(cls):
            raise TypeError(f"{cls.__name__}.{name} is written by hand but not listed in WRITTEN")
        setattr(cls, name, kernel_method(kernel))
