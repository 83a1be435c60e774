"""The project's import graph, read from the source with ``ast`` (nothing is imported).

An edge ``a -> b`` is any import statement in module ``a`` that names module ``b`` of the
scanned tree: at module level, inside a function, or under ``if TYPE_CHECKING:`` alike. A
``TYPE_CHECKING`` import is no edge at run time, but it still tells a reader that ``a`` depends
on ``b``, and a circle of them is a circle in the design, so the graph counts it.
``from X import Y`` names the module ``X.Y`` when there is one, else ``X``; a string-named
``importlib.import_module``/``__import__`` call counts as ``import``. Importing a package counts
as an edge to its ``__init__`` only, not to the modules that ``__init__`` imports (those are its
own edges).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` names ``target`` at ``line`` of ``path``."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def modules_under(root: Path, prefix: str, base: Path) -> dict[str, Path]:
    """Module name -> file for every ``.py`` file under ``root``, named from ``prefix``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([prefix, *parts]) if parts else prefix] = path
    return found


def _named(node: ast.AST, package: str) -> Iterable[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of one import node or import call."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield node.lineno, alias.name, []
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            head = parts[:len(parts) - node.level + 1]
            base = ".".join(head + ([base] if base else []))
        yield node.lineno, base, [alias.name for alias in node.names]
    elif (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
          and getattr(node.func, "attr", getattr(node.func, "id", None))
          in ("import_module", "__import__")):
        yield node.lineno, node.args[0].value, []


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a scanned module, or None (torch, stdlib...)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def edges_of(modules: Mapping[str, Path], base: Path) -> list[Edge]:
    """Every import edge between the scanned modules, self-imports left out."""
    edges = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for line, module, names in _named(node, package):
                named = [f"{module}.{n}" for n in names] or [module]
                for target in {_known(name, modules) for name in named}:
                    if target is not None and target != source:
                        edges.append(Edge(source, target, str(path.relative_to(base)), line))
    return edges


def circles(edges: Iterable[Edge]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def loop_in(members: list[str], edges: Iterable[Edge]) -> list[Edge]:
    """One closed path through a circle's modules, as the edges that make it (for the message)."""
    inside = set(members)
    out: dict[str, list[Edge]] = {}
    for e in edges:
        if e.source in inside and e.target in inside:
            out.setdefault(e.source, []).append(e)
    start = members[0]
    path, seen = [], {start: 0}
    node = start
    while True:
        step = min(out[node], key=lambda e: (e.target != start, e.target in seen, e.target))
        path.append(step)
        if step.target in seen:
            return path[seen[step.target]:]
        seen[step.target] = len(path)
        node = step.target


def floor_of(module: str, floors: Mapping[str, int]) -> int | None:
    """The floor of ``module``: that of the longest entry of the table that is the module or a
    package above it; None when no entry is."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in floors:
            return floors[".".join(parts[:end])]
    return None


def upward(edges: Iterable[Edge], floors: Mapping[str, int]) -> list[Edge]:
    """The edges from a module to one on a higher floor (modules on no floor are left to the
    check that every module stands on one)."""
    found = []
    for e in edges:
        low, high = floor_of(e.source, floors), floor_of(e.target, floors)
        if low is not None and high is not None and low < high:
            found.append(e)
    return found
