"""The package's layout, read from its sources (no import, no framework): packages by layer (at
most 20 nodes at the top level, at most 10 layers, every import from a higher layer to a lower
one), no import circle among hvdcompress's modules, a docstring at the top of every package
saying what it owns and may import, no Python file over 400 lines but the Triton kernels, and
front ends that keep only framework hooks and tensor conversion (300 lines each)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hvdcompress"
MAX_LINES = 400
LONG_ALLOWED = {"ops/triton_kernels.py"}
FRONT_ENDS = ("torch/optimizer.py", "torch/ddp.py", "torch/fsdp.py", "torch/hsdp.py", "torch/diloco.py",
              "tensorflow/exchange.py", "tensorflow/tape.py", "tensorflow/keras/optimizer.py")
FRONT_END_LINES = 300
#: The layers, lowest first: a top-level node (a subpackage or a module of hvdcompress) imports
#: only nodes of lower layers. ``__main__`` modules are programs, outside the graph.
LAYERS = (
    ("ops",),                      # the Ops facade, its framework implementations, the kernels
    ("contract",),                 # Compressor, Packet, decorators, schedules, validation
    ("compressors", "transport"),  # the algorithms; collectives, rounds, process sets, waiting
    ("adam", "state"),             # the Adam take-over; the state store, resharding
    ("registry", "engines"),       # building compressors from strings; the exchanges
    ("step", "plan"),              # the step driver and its options; the cost model
    ("auto",),                     # compression="auto", a planner over the cost model
    ("torch", "tensorflow"),       # the front ends
    ("",),                         # hvdcompress itself: the public names
)
MAX_TOP_LEVEL = 20
MAX_LAYERS = 10


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
    assert "hvdcompress.contract.compressor" in graph["hvdcompress.auto.choice"]  # from ..compressor import ...
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


def top_level(module: str) -> str:
    """The top-level node of ``module``: hvdcompress.engines.exchange -> engines; hvdcompress -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def top_level_graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for name, deps in import_graph().items():
        if name.endswith(".__main__"):
            continue
        graph.setdefault(top_level(name), set()).update(
            top_level(d) for d in deps if top_level(d) != top_level(name))
    return graph


def test_packages_by_layer():
    graph = top_level_graph()
    layer = {node: i for i, nodes in enumerate(LAYERS) for node in nodes}
    assert len(graph) <= MAX_TOP_LEVEL, f"{len(graph)} top-level nodes: {sorted(graph)}"
    assert len(LAYERS) <= MAX_LAYERS
    assert set(graph) == set(layer), f"nodes without a layer: {sorted(set(graph) - set(layer))}; " \
                                     f"layers without a node: {sorted(set(layer) - set(graph))}"
    upward = sorted(f"{a or 'hvdcompress'} -> {b}" for a, deps in graph.items() for b in deps
                    if layer[b] >= layer[a])
    assert not upward, "imports that do not go down a layer: " + ", ".join(upward)
    assert find_cycle(graph) is None


def test_the_layer_check_can_fail():
    """An import from the ops to the step (a lower layer to a higher one) is caught."""
    layer = {node: i for i, nodes in enumerate(LAYERS) for node in nodes}
    graph = {"ops": {"step"}, "step": {"ops"}}
    assert [f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer[b] >= layer[a]] == ["ops -> step"]


def test_every_package_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"packages without a docstring: {missing}"


def test_no_measurement_history_in_the_package():
    """Docstrings and comments state the rule, its maths and its trade-off and point to a section
    of benchmarks/README.md for the numbers: no "issue N" and no "before -> after" figures
    ("+0.027 -> +0.007", "9.5x -> 10.7x", "W = 128 -> 256") in any hvdcompress/*.py, read as text."""
    import re

    issue = re.compile(r"\b[Ii]ssues?\s*#?\d")
    figures = re.compile(r"\d[\d.,]*x?\s*(?:->|→|=>)\s*[+-]?\.?\d")   # a number, an arrow, a number
    old = ("the cap until issue 36's last round: onebit +0.027 -> +0.007 (9.5x -> 10.7x fewer bytes),\n"
           "transformer, 0.999: +0.150 -> +0.106; 0.95: +0.029\n-> +0.025; W = 128 -> 256")
    assert issue.search(old) and len(figures.findall(old)) == 5   # the check can fail
    for text in ("tensor name -> the collective", "v <- (1 - alpha)·v + alpha·g²", "g ← g + λ·w",
                 "op=Sum (p.grad is G_k) -> the sum", "would issue Horovod collectives"):
        assert not issue.search(text) and not figures.search(text), text
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for pattern in (issue, figures):
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert not found, "measurement history in the package (move it to benchmarks/README.md): " \
                      + "; ".join(found)
