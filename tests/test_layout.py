"""The package's layout, read from its sources (no import, no framework): no import circle among
hvdcompress's modules, no Python file over 400 lines but the Triton kernels, and front ends that
keep only framework hooks and tensor conversion (300 lines each)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hvdcompress"
MAX_LINES = 400
LONG_ALLOWED = {"ops/triton_kernels.py"}
FRONT_ENDS = ("torch/optimizer.py", "torch/ddp.py", "tensorflow/exchange.py")
FRONT_END_LINES = 300


def modules() -> Dict[str, Path]:
    """Module name -> source of every module of the package (a package is its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The package's modules that module ``name`` imports anywhere in its source (module level,
    in functions, under TYPE_CHECKING): ``from . import x`` imports the submodule ``x``;
    ``from .pkg import name`` imports ``pkg`` when ``name`` is not a submodule of it."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    found.add(submodule)
                elif source in known:
                    found.add(source)
    found.discard(name)
    return found


def import_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import circle of ``graph`` as [a, b, ..., a], or None (depth-first, iterative)."""
    state: Dict[str, int] = {}   # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(step) == 1:
                return path[path.index(step):] + [step]
            elif step not in state:
                state[step] = 1
                path.append(step)
                stack.append(iter(sorted(graph[step])))
    return None


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_graph_sees_every_kind_of_import():
    """The graph's own check: relative, absolute, in functions and under TYPE_CHECKING."""
    graph = import_graph()
    assert "hvdcompress.registry" in graph["hvdcompress"]                # from .registry import ...
    assert "hvdcompress.auto" in graph["hvdcompress"]                    # from . import auto
    assert "hvdcompress.plan.collectives" in graph["hvdcompress.plan.exchanges"]  # from . import collectives as coll
    assert "hvdcompress.compressor" in graph["hvdcompress.auto.choice"]  # from ..compressor import ...
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_python_file_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): lines(p) for p in PACKAGE.rglob("*.py")
            if lines(p) > MAX_LINES and str(p.relative_to(PACKAGE)) not in LONG_ALLOWED}
    assert not long, f"over {MAX_LINES} lines (split them along their seams): {long}"


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_front_ends_keep_only_framework_hooks(front_end):
    """The step lives in the core; a front end is its framework's hooks and tensor conversion."""
    count = lines(PACKAGE / front_end)
    assert count <= FRONT_END_LINES, f"hvdcompress/{front_end}: {count} lines (at most {FRONT_END_LINES})"
