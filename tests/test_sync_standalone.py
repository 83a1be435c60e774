"""The hook library stands alone: ``openclaw_ref.sync`` imports only torch and its own modules.

Two proofs: a fresh interpreter that imports the package (and every module in it) holds no
``openclaw_ref`` module outside ``openclaw_ref.sync`` but the empty ``openclaw_ref`` package
itself; and no file under ``openclaw_ref/sync/`` names another ``openclaw_ref`` module in an
import statement or an import call, at any depth (lazy imports inside functions included).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import exception_classes_of

ROOT = Path(__file__).resolve().parents[1]
SYNC = ROOT / "openclaw_ref" / "sync"

LOADED = """
import json, pkgutil, importlib, sys
import openclaw_ref.sync
for info in pkgutil.walk_packages(openclaw_ref.sync.__path__, "openclaw_ref.sync."):
    importlib.import_module(info.name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "openclaw_ref")))
"""


def inside_sync(module: str) -> bool:
    return module == "openclaw_ref.sync" or module.startswith("openclaw_ref.sync.")


def loaded_by(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def imported_names(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``tree`` (a module of ``package``), with
    ``from X import Y`` counted as X.Y, and string-named ``import_module``/``__import__`` calls."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def test_importing_the_hook_library_loads_no_other_openclaw_module():
    loaded = loaded_by(LOADED)
    assert "openclaw_ref.sync.fsdp.guard" in loaded  # every module was imported, lazy too
    assert [m for m in loaded if m != "openclaw_ref" and not inside_sync(m)] == []


def test_no_file_of_the_hook_library_imports_outside_it():
    files = sorted(SYNC.rglob("*.py"))
    assert len(files) > 10
    outside = [f"{f.relative_to(ROOT)}:{line}: {name}"
               for f in files
               for line, name in imported_names(ast.parse(f.read_text(), str(f)),
                                                "openclaw_ref.sync")
               if name.split(".")[0] == "openclaw_ref" and not inside_sync(name)]
    assert outside == []


def test_the_scan_sees_every_form_of_import_outside_the_library():
    source = "\n".join([
        "import openclaw_ref.core.launch",
        "from openclaw_ref.core import train",
        "from openclaw_ref import cli",
        "from .. import core",
        "def lazy():",
        "    from openclaw_ref.ops.doctor import diagnose",
        "    return importlib.import_module('openclaw_ref.reporting.render')",
        "from openclaw_ref.sync.base import SyncConfig",
        "from . import checks",
    ])
    names = [name for _, name in imported_names(ast.parse(source), "openclaw_ref.sync")]
    assert {n for n in names if not inside_sync(n)} == {
        "openclaw_ref.core.launch", "openclaw_ref.core.train", "openclaw_ref.cli",
        "openclaw_ref.core", "openclaw_ref.ops.doctor.diagnose", "openclaw_ref.reporting.render"}


def test_every_error_class_is_exported_by_the_hook_library():
    import openclaw_ref.sync as sync

    errors = exception_classes_of(SYNC / "errors.py")
    assert {"ConsistencyError", "ReplicaDivergence", "SyncTimeout", "CollectiveFailed",
            "BadInput"} <= errors
    assert errors <= set(sync.__all__)
    assert set(sync.__all__) == set(sync._HOME)
    assert all(isinstance(getattr(sync, name), type) for name in errors)


def test_catching_an_error_from_the_hook_library_does_not_import_torch():
    code = ("import json, sys\n"
            "from openclaw_ref.sync import ReplicaDivergence, ConsistencyError, SyncTimeout\n"
            "assert issubclass(ReplicaDivergence, ConsistencyError)\n"
            "print(json.dumps('torch' in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) is False
