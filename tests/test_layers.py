"""The house has floors and one way through it: no import circle anywhere in the package, the
conformance suite and the benchmarks, and no module imports one on a higher floor.

What counts as an import (``tests/import_graph.py``): every import statement, at module level,
inside a function, or under ``if TYPE_CHECKING:``. A lazy or type-only import is no edge at
start-up, but it is a dependency a reader sees, and a circle closed by one is still a circle in
the design, so both count. A failure names the circle's path or the upward arrow, with the file
and line of each import.

``FLOORS`` is the one table of floors; docs/layout.md shows it (``test_the_layout_page_shows_
these_floors`` keeps the two equal). A module stands on the floor of the longest entry that is
it or a package above it; modules on one floor may import each other, without a circle.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.import_graph import circles, edges_of, floor_of, loop_in, modules_under, upward

ROOT = Path(__file__).resolve().parents[1]

# (floor, what stands on it, its entries) from the ground up
FLOORS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (0, "the hook library (torch only), and the CLI's choice lists (plain constants, no "
        "import, read by conformance's plugin without torch)",
     ("openclaw_ref.sync", "openclaw_ref.cli.choices")),
    (1, "the benchmark's arms beside the hook library (stock DDP, the seed's fixes); the model, "
        "the loop and its callback protocol, the launcher",
     ("openclaw_ref.arms", "openclaw_ref.core")),
    (2, "what reads or serves a run: the record and its renderer, the doctor and the metrics "
        "sink, the FSDP2 and FSDP2 × TP corpus scripts",
     ("openclaw_ref.reporting", "openclaw_ref.ops", "openclaw_ref.fsdp_corpus",
      "openclaw_ref.tp_corpus")),
    (3, "the conformance checks and the Lightning integration",
     ("openclaw_ref.conformance", "openclaw_ref.integrations")),
    (4, "the measurements: compare's sections run bench's jobs, and bench's asv cache runs "
        "experiments' hook-cost and FSDP2-cost jobs, so the two share a floor",
     ("openclaw_ref.experiments", "openclaw_ref.bench")),
    (5, "the entry points", ("openclaw_ref.cli", "openclaw_ref.__main__", "openclaw_ref.bench.cli",
                             "openclaw_ref.bench.__main__")),
    (6, "the suites that drive everything below: conformance's tests, asv's benchmarks",
     ("openclaw_ref.conformance.suite", "benchmarks")),
)
FLOOR_OF = {entry: floor for floor, _, entries in FLOORS for entry in entries}
ROOT_PACKAGE = "openclaw_ref"  # its __init__ only names the rooms: it imports nothing


def scanned() -> dict[str, Path]:
    return {**modules_under(ROOT / "openclaw_ref", "openclaw_ref", ROOT),
            **modules_under(ROOT / "conformance", "openclaw_ref.conformance", ROOT),
            **modules_under(ROOT / "benchmarks" / "benchmarks", "benchmarks", ROOT)}


@pytest.fixture(scope="module")
def graph():
    modules = scanned()
    return modules, edges_of(modules, ROOT)


def describe_circles(found, edges) -> str:
    return "\n".join(f"circle of {len(c)} modules:\n  " + "\n  ".join(map(str, loop_in(c, edges)))
                     for c in found)


def test_no_import_circle_in_the_package_the_suite_or_the_benchmarks(graph):
    modules, edges = graph
    assert len(modules) > 150 and len(edges) > 500  # the scan saw the whole house
    found = circles(edges)
    assert not found, describe_circles(found, edges)


def test_no_module_imports_one_on_a_higher_floor(graph):
    _, edges = graph
    arrows = [f"{e} (floor {floor_of(e.source, FLOOR_OF)} -> {floor_of(e.target, FLOOR_OF)})"
              for e in upward(edges, FLOOR_OF)]
    assert not arrows, "imports from a lower floor to a higher one:\n  " + "\n  ".join(arrows)


def test_every_module_stands_on_a_floor(graph):
    modules, edges = graph
    assert [m for m in modules if floor_of(m, FLOOR_OF) is None] == [ROOT_PACKAGE]
    assert [e for e in edges if e.source == ROOT_PACKAGE] == []


def test_the_layout_page_shows_these_floors():
    page = (ROOT / "docs" / "layout.md").read_text()
    shown = {int(m[1]): set(re.findall(r"`([\w.]+)`", m[2]))
             for m in re.finditer(r"^\| (\d) \| ([^|]*) \|", page, re.M)}
    assert shown == {floor: {e.removeprefix("openclaw_ref.") for e in entries}
                     for floor, _, entries in FLOORS}


# --- the checker itself, on a tiny package of its own ----------------------------------------

def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_under(root / "pkg", "pkg", root)


def test_the_checker_finds_a_circle_closed_by_a_lazy_import_and_names_its_path(tmp_path):
    modules = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import thing\n",
        "b.py": "def thing():\n    from . import c\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg import a\n"})
    edges = edges_of(modules, tmp_path)
    assert circles(edges) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert [str(e) for e in loop_in(["pkg.a", "pkg.b", "pkg.c"], edges)] == [
        "pkg.a -> pkg.b (pkg/a.py:1)", "pkg.b -> pkg.c (pkg/b.py:2)",
        "pkg.c -> pkg.a (pkg/c.py:1)"]


def test_the_checker_counts_an_import_under_type_checking(tmp_path):
    modules = write_package(tmp_path, {
        "__init__.py": "",
        "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from pkg.driver import Progress\n",
        "driver.py": "from pkg.config import Config\n"})
    assert circles(edges_of(modules, tmp_path)) == [["pkg.config", "pkg.driver"]]


def test_the_checker_sees_no_circle_in_a_package_that_points_one_way(tmp_path):
    modules = write_package(tmp_path, {
        "__init__.py": "", "low.py": "import os\n", "mid.py": "from .low import x\n",
        "top/__init__.py": "", "top/run.py": "from ..mid import y\nfrom pkg import low\n"})
    edges = edges_of(modules, tmp_path)
    assert {(e.source, e.target) for e in edges} == {
        ("pkg.mid", "pkg.low"), ("pkg.top.run", "pkg.mid"), ("pkg.top.run", "pkg.low")}
    assert circles(edges) == []


def test_the_checker_names_an_import_from_a_lower_floor_to_a_higher_one(tmp_path):
    modules = write_package(tmp_path, {
        "__init__.py": "", "ground/__init__.py": "", "ground/base.py": "",
        "ground/leak.py": "def f():\n    from pkg.upstairs import view\n",
        "upstairs.py": "from pkg.ground.base import x\n"})
    floors = {"pkg.ground": 0, "pkg.upstairs": 1}
    assert [str(e) for e in upward(edges_of(modules, tmp_path), floors)] == [
        "pkg.ground.leak -> pkg.upstairs (pkg/ground/leak.py:2)"]
