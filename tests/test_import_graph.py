"""No import circles among mrc's modules (issue 41, item 3).

Every module under mrc/ is parsed (not imported): its imports, at module level and inside
functions alike (an import inside a function hides a circle, it does not remove it), make
the edges of a graph of the package's modules; ``if TYPE_CHECKING:`` blocks are left out,
since they never run. A strongly connected component of more than one module (Tarjan), or
a module importing itself, is a circle, and the test names each one.

Importing a package runs its ``__init__``, so ``from mrc.core.cc import x`` is an edge to
``mrc.core.cc`` (and to ``mrc.core.cc.x`` when ``x`` is a submodule); a module's own parent
packages are not counted as its imports (Python runs them first anyway, and counting them
would make every ``__init__`` that imports its children a circle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "mrc"
PACKAGE = "mrc"

#: Circles known and not yet cured, each as the sorted names of its modules: none. A new
#: circle fails the test; cure it rather than listing it here (issue 41).
KNOWN_CIRCLES: frozenset[frozenset[str]] = frozenset()


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> its file, for every .py file of the package."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: ``if TYPE_CHECKING:`` bodies skipped (their
    ``else:`` kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _base_of(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    parts = name.split(".")
    if not is_package:
        parts.pop()
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    if node.module:
        parts.append(node.module)
    return ".".join(parts)


def _within(target: str, modules: Mapping[str, object]) -> str | None:
    """``target`` or the nearest enclosing module of the package that exists."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def edges_of(name: str, source: str, is_package: bool, modules: Mapping[str, object]) -> set[str]:
    """The package's modules that module ``name`` (``source``) imports."""
    out: set[str] = set()
    for node in _imports(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _base_of(name, is_package, node)
            targets = [base]
            targets += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        for target in targets:
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            found = _within(target, modules)
            if found is not None:
                out.add(found)
    # itself (``from . import q`` in a package names it too) and its own parent packages
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    return out - ancestors


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    return {
        name: edges_of(name, path.read_text(), path.name == "__init__.py", files)
        for name, path in files.items()
    }


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components that are circles (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def _describe(component: list[str], graph: Mapping[str, Iterable[str]]) -> str:
    members = set(component)
    lines = [f"circle of {len(component)}: {', '.join(component)}"]
    for name in component:
        inside = sorted(set(graph[name]) & members)
        lines.append(f"    {name} -> {', '.join(inside)}")
    return "\n".join(lines)


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "mrc.core.config" in graph and "mrc.core.cc.registry" in graph  # the walk works
    new = [c for c in circles(graph) if frozenset(c) not in KNOWN_CIRCLES]
    assert not new, "import circles (issue 41):\n" + "\n".join(_describe(c, graph) for c in new)


def test_known_circles_are_still_there() -> None:
    """An entry of KNOWN_CIRCLES that is cured leaves the list."""
    present = {frozenset(c) for c in circles(import_graph())}
    assert not (KNOWN_CIRCLES - present), "cured: drop from KNOWN_CIRCLES"


# ---- the walk itself, on small made-up inputs --------------------------------------------


def test_tarjan_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"], ["e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_long_chain_does_not_recurse() -> None:
    n = 5000
    graph = {f"m{i}": {f"m{i + 1}"} for i in range(n)}
    graph[f"m{n}"] = {"m0"}
    assert len(circles(graph)[0]) == n + 1


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from mrc.b import x\n", {"mrc.b"}),  # x a name in mrc.b
        ("from mrc import b\n", {"mrc.b"}),  # b a submodule (mrc itself: an ancestor)
        ("from . import b\n", {"mrc.b"}),
        ("from .b import x\n", {"mrc.b"}),
        ("import mrc.b.c\n", {"mrc.b"}),  # no such module: its nearest package
        ("def f():\n    from mrc.b import x\n", {"mrc.b"}),  # inside a function counts
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mrc.b import x\n", set()),
        (
            "import typing\nif typing.TYPE_CHECKING:\n    import mrc.b\nelse:\n    import mrc.c\n",
            {"mrc.c"},
        ),
        ("import os\nfrom json import dumps\n", set()),
    ],
)
def test_edges(source: str, expected: set[str]) -> None:
    modules = {"mrc": 0, "mrc.a": 0, "mrc.b": 0, "mrc.c": 0}
    assert edges_of("mrc.a", source, False, modules) == expected


def test_edges_relative_in_package() -> None:
    modules = {"mrc": 0, "mrc.p": 0, "mrc.p.q": 0, "mrc.r": 0}
    assert edges_of("mrc.p", "from . import q\nfrom .. import r\n", True, modules) == {
        "mrc.p.q",
        "mrc.r",
    }


def test_a_circle_in_files_is_caught(tmp_path: Path) -> None:
    pkg = tmp_path / "mrc"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "config.py").write_text("def f():\n    from mrc.core.law import X\n")
    (pkg / "core" / "law.py").write_text("from mrc.core.config import Y\n")
    assert circles(import_graph(pkg)) == [["mrc.core.config", "mrc.core.law"]]
