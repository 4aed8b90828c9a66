"""No import cycle inside ``pytest_accelperf/``: the dependency graph flows one way.

A small walker of our own (``ast``, nothing imported): every ``import`` and ``from ...
import`` of every module counts, at module level, inside functions and under
``TYPE_CHECKING`` alike; ``from package import name`` is an edge to ``package.name`` when
that is a module. A package's ``__init__`` re-exporting its own submodules is not an edge
(that is what ``__init__`` is for).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import pytest_accelperf

PACKAGE = Path(pytest_accelperf.__file__).resolve().parent


def module_files(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under the package ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``target`` names (``a.b.name`` -> ``a.b``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            module = _resolve(target, known)
            if module is None or module == name:
                continue
            if is_package and module.startswith(name + "."):
                continue  # an __init__ re-exporting its own submodule
            found.add(module)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    known = module_files(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 50  # the walker saw the package (not an empty directory)
    assert "pytest_accelperf.backends.protocol" in graph["pytest_accelperf.backends.torch.backend"]
    found = cycles(graph)
    assert not found, "import cycles (break them by moving what both need into a module " \
        "both can import):\n" + "\n".join(" <-> ".join(c) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


@pytest.mark.parametrize("b_imports_a", [
    "from pkg.a import X",  # module level
    "def f():\n    from pkg import a\n    return a",  # inside a function, package form
    "def f():\n    from . import a\n    return a",  # relative
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.sub.c\n",  # via c
])
def test_the_walker_sees_every_kind_of_import(tmp_path: Path, b_imports_a: str) -> None:
    root = _package(tmp_path, {
        "a.py": "from pkg.b import Y\nX = 1\n",
        "b.py": b_imports_a + "\nY = 2\n",
        "sub/__init__.py": "from pkg.sub.c import Z\n",  # re-export: not a cycle
        "sub/c.py": "from pkg.a import X\nZ = 3\n",
        "d.py": "import pkg.a\n",
    })
    found = cycles(import_graph(root))
    expected = ["pkg.a", "pkg.b", "pkg.sub.c"] if "TYPE_CHECKING" in b_imports_a \
        else ["pkg.a", "pkg.b"]
    assert found == [expected]


def test_a_package_reexporting_its_submodules_is_not_a_cycle(tmp_path: Path) -> None:
    root = _package(tmp_path, {"__init__.py": "from pkg.a import X\n",
                               "a.py": "import pkg.b\nX = 1\n", "b.py": "Y = 2\n"})
    assert import_graph(root)["pkg"] == set()
    assert cycles(import_graph(root)) == []
