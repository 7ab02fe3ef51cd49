"""A griffe extension for the docs build (mkdocs.yml): the names a package exports lazily.

``hvdcompress.torch`` imports Horovod only on first use (PEP 562): ``DistributedOptimizer``
and friends are not assigned in its ``__init__.py`` but looked up by its ``__getattr__`` in a
module-level dict ``{name: submodule}`` (``_HOROVOD_ATTRIBUTES``). griffe reads the package
statically (no torch or Horovod import to build the docs), so it would not see them; this
extension reads every such dict (a module-level dict literal of string keys and values whose
name ends in ``_ATTRIBUTES``, in a module that defines ``__getattr__``) and adds each name as an
alias of ``<module>.<submodule>.<name>``. The docs then name the public path
(``hvdcompress.torch.DistributedOptimizer``) and follow the package's own table wherever the
modules behind it move.
"""
from __future__ import annotations

import ast
from typing import Any

import griffe


class LazyExports(griffe.Extension):
    def on_module_members(self, *, node: Any, mod: griffe.Module, **kwargs: Any) -> None:
        if not isinstance(node, ast.Module):
            return
        if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in node.body):
            return
        for statement in node.body:
            if not (isinstance(statement, (ast.Assign, ast.AnnAssign)) and isinstance(statement.value, ast.Dict)):
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if not any(isinstance(t, ast.Name) and t.id.endswith("_ATTRIBUTES") for t in targets):
                continue
            for key, value in zip(statement.value.keys, statement.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) \
                        and isinstance(key.value, str) and isinstance(value.value, str) \
                        and key.value not in mod.members:
                    mod.set_member(key.value, griffe.Alias(key.value, f"{mod.path}.{value.value}.{key.value}",
                                                           parent=mod))
