"""The layout the design card names: the conformance suite's folder is ``conformance/`` at the
top of the repository, shipped as ``openclaw_ref.conformance`` (pyproject's ``package-dir``).
setuptools cannot discover a package under another name, so pyproject lists every package:
these tests fail naming a package directory the list leaves out (it would be missing from the
wheel), and show that the installed name resolves to the checkout's folder and that pytest
collects the suite from one path only."""

from __future__ import annotations

from pathlib import Path

import pytest

import openclaw_ref.conformance

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def package_names(folder: Path, name: str) -> set[str]:
    """Dotted names of ``folder`` and every package below it (a directory with __init__.py)."""
    return {".".join((name, *init.parent.relative_to(folder).parts))
            for init in folder.rglob("__init__.py")}


def test_every_package_directory_is_listed_for_the_wheel():
    found = package_names(ROOT / "openclaw_ref", "openclaw_ref") | package_names(
        ROOT / "conformance", "openclaw_ref.conformance")
    listed = set(SETUPTOOLS["packages"])
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no folder"


def test_openclaw_ref_conformance_is_the_top_level_conformance_folder():
    assert SETUPTOOLS["package-dir"] == {"openclaw_ref.conformance": "conformance"}
    assert not (ROOT / "openclaw_ref" / "conformance").exists()
    assert Path(openclaw_ref.conformance.__file__).parent == ROOT / "conformance"


def test_pytest_collects_the_suite_from_one_path():
    testpaths = PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"]
    assert testpaths == ["tests", "conformance/suite"]
    assert not list((ROOT / "tests").rglob("test_zoo.py"))


def test_the_repository_tracks_nothing_the_readme_commands_create():
    """The README's commands (and CI) make ``.venv`` and ``.tox`` in a clean clone: a tracked
    file of either name makes ``python3 -m venv .venv`` fail there, so CI could not start."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "--", ".venv", ".tox", "results/*/.partial"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert tracked.split() == []
