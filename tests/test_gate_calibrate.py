"""The calibration's machinery without timing anything: each commit's library extracted under
its own name and importable; the scratch commits (a comment that leaves the code identical, a
busy-wait in the step guard's per-step path) made, deterministic and removed; a calibration
interrupted and resumed runs every scheduled gate run once. The gate itself on a real plant is
the slow test at the end."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_ref.bench.gate import calibrate as cal
from openclaw_ref.bench.gate import plant
from openclaw_ref.bench.gate.stat import Verdict
from openclaw_ref.bench.gate.trees import SYNC_NAME, Side, aliased, extract
from openclaw_ref.sync.errors import BadInput
from tests.helpers import ROOT

GUARD = (ROOT / plant.PLANT_PATH).read_text()


def method(source: str, name: str = plant.PLANT_METHOD) -> ast.FunctionDef:
    cls = next(n for n in ast.parse(source).body
               if isinstance(n, ast.ClassDef) and n.name == plant.PLANT_CLASS)
    return next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name)


def test_a_comment_only_change_leaves_the_code_identical():
    changed = plant.with_comment(GUARD)
    assert changed != GUARD and ast.dump(ast.parse(changed)) == ast.dump(ast.parse(GUARD))


def test_the_busy_wait_is_planted_after_settles_early_return_only():
    settle = ast.unparse(method(plant.with_busy_wait(GUARD, 1234)))
    early = settle.index("if self._pending is None:")
    spin = settle.index("_until = time.perf_counter() + 1234 * 1e-06")
    assert early < spin < settle.index("record, counted = self._pending")
    assert ast.unparse(method(plant.with_busy_wait(GUARD, 1), "_exchange")) == \
        ast.unparse(method(GUARD, "_exchange"))  # nothing else moved
    with pytest.raises(BadInput, match="update plant"):
        plant.with_busy_wait(GUARD.replace("if self._pending is None:", "if False:"), 5)


def test_the_alias_renames_every_library_name_and_nothing_else():
    text = "from openclaw_ref.sync.base import X\nimport openclaw_ref.synced\nopenclaw_ref.core\n"
    assert aliased(text, "gate_x") == ("from gate_x.base import X\nimport openclaw_ref.synced\n"
                                       "openclaw_ref.core\n")


def test_a_commits_library_is_extracted_under_its_alias_and_imports_there(tmp_path):
    tree = extract(ROOT, Side.BASE, "HEAD", tmp_path)
    package = Path(tree.root) / Side.BASE.alias
    assert not [p for p in package.rglob("*.py") if SYNC_NAME.search(p.read_text())]
    code = (f"import sys; sys.path.insert(0, {tree.root!r}); "
            f"from {tree.module}.hardening import harden; "
            "print(harden.__module__, sorted(m for m in sys.modules if m.startswith('openclaw_')"
            " and not m.startswith('openclaw_gate_base')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.stdout.strip() == "openclaw_gate_base.hardening []", out.stderr[-2000:]
    with pytest.raises(BadInput):
        extract(ROOT, Side.HEAD, "no-such-commit-anywhere", tmp_path)


@pytest.fixture
def repo(tmp_path):
    """A scratch git repository holding the step guard at the plant's path."""
    root = tmp_path / "repo"
    (root / Path(plant.PLANT_PATH).parent).mkdir(parents=True)
    (root / plant.PLANT_PATH).write_text(GUARD)
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


def test_scratch_commits_are_real_deterministic_one_file_and_removed(repo):
    a = plant.scratch_commit(repo, "HEAD", plant.Change.BUSY_WAIT, "busy", 900)
    assert plant.scratch_commit(repo, "HEAD", plant.Change.BUSY_WAIT, "busy", 900) == a
    files = plant.run_git(repo, "diff", "--name-only", "HEAD", a)
    assert files == plant.PLANT_PATH
    assert "900 * 1e-6" in plant.run_git(repo, "show", f"{a}:{plant.PLANT_PATH}")
    plant.scratch_commit(repo, "HEAD", plant.Change.COMMENT, "identical")
    assert plant.remove_refs(repo, ["identical"]) == [plant.REF_PREFIX + "identical"]
    assert plant.remove_refs(repo, ["busy", "identical"]) == [plant.REF_PREFIX + "busy"]
    assert plant.remove_refs(repo, ["busy"]) == []
    assert plant.run_git(repo, "status", "--porcelain") == ""  # no checkout touched


def held(repo: Path) -> list[str]:
    return plant.run_git(repo, "for-each-ref", plant.REF_PREFIX).splitlines()


def fake_compare(stop_after: int | None = None):
    """A gate run that measures nothing: it reads back exactly the µs planted, of a 40 ms
    stock step."""
    calls = []

    def compare(repo, base, head, gate_plan, progress):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        source = plant.run_git(repo, "show", f"{head}:{plant.PLANT_PATH}")
        us = int(source.split("perf_counter() + ")[1].split(" ")[0]) if "_until" in source else 0
        calls.append(head)
        point = us / 40e3
        return {"stock_step_ms": 40.0, "stop": "at the last look",
                "excess": {"point": point, "low": point - 0.01, "high": point + 0.01,
                           "us": float(us), "low_us": us - 400.0, "high_us": us + 400.0,
                           "jobs": 4, "stock_step_ms": 40.0},
                "verdict": (Verdict.SLOWER if point >= 0.025 else Verdict.WITHIN).value,
                "old_rule": {"flagged": False}, "seconds": 1.0, "jobs": []}
    return compare, calls


def test_a_calibration_interrupted_resumes_and_runs_each_scheduled_run_once(repo, monkeypatch):
    plan = cal.CalibrationPlan(runs=2)
    out = repo / "out"
    first, calls = fake_compare(stop_after=3)
    monkeypatch.setattr(cal, "compare", first)
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(repo, out, plan, progress=lambda m: None)
    assert held(repo) == []  # removed on the way out, however it ended
    assert len(json.loads((out / cal.PARTIAL / cal.RECORD).read_text())["runs"]) == 3
    again, more = fake_compare()
    monkeypatch.setattr(cal, "compare", again)
    record = cal.calibrate(repo, out, plan, progress=lambda m: None)
    assert len(more) == 2 * 4 - 3 and record["complete"] and held(repo) == []
    assert [(r["condition"], r["index"]) for r in record["runs"]] == \
        [(c.name, i) for i, c in plan.schedule()]
    assert record["busy_wait_us"] == {"+3%": 1200, "+5%": 2000, "+10%": 4000}
    assert {r["condition"]: r["verdict"] for r in record["runs"]}["+5%"] == "slower"
    assert not (out / cal.PARTIAL / cal.RECORD).exists() and (out / cal.RECORD).exists()
    assert record["wall_s"] > 0 and all(len(r["load_before"]) == 3 for r in record["runs"])


def test_a_partial_record_of_another_plan_is_refused(repo, monkeypatch):
    first, _ = fake_compare(stop_after=1)
    monkeypatch.setattr(cal, "compare", first)
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(repo, repo / "out", cal.CalibrationPlan(runs=2), progress=lambda m: None)
    with pytest.raises(BadInput, match="another plan"):
        cal.calibrate(repo, repo / "out", cal.CalibrationPlan(runs=3), progress=lambda m: None)


@pytest.mark.slow
def test_the_gate_flags_a_real_planted_slowdown_and_not_a_comment(tmp_path):
    """End to end on 2 gloo ranks (~1 min): scratch commits on HEAD, the gate run as users run
    it (four jobs on one pair of ranks: with two, the interval's 1 degree of freedom let a
    10 ms plant read *noisy* in 3 of 6 runs), a 10 ms busy-wait flagged and read back in µs,
    a comment not flagged."""
    from openclaw_ref.bench.gate.run import GatePlan, compare
    from openclaw_ref.bench.gate.stopping import StoppingRule

    short = GatePlan(rounds=40, warmup=3, rule=StoppingRule.up_to(4, early=False))
    clone = tmp_path / "clone"  # the scratch commits go here, never into the checkout's repo
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(clone)],
                   check=True, capture_output=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "--detach",
                    plant.run_git(ROOT, "rev-parse", "HEAD")], check=True, capture_output=True)
    slow = plant.scratch_commit(clone, "HEAD", plant.Change.BUSY_WAIT, "test-slow", 10_000)
    same = plant.scratch_commit(clone, "HEAD", plant.Change.COMMENT, "test-identical")
    flagged = compare(clone, "HEAD", slow, short)
    quiet = compare(clone, "HEAD", same, short)
    assert flagged["verdict"] == "slower" and flagged["excess"]["us"] > 5_000
    assert len(flagged["jobs"]) == 4 and len(flagged["jobs"][0]["step_ms"]["head"]) == 40
    assert len(flagged["jobs"][0]["step_ms"]["ddp"]) == 10  # every 4th round
    assert quiet["verdict"] != "slower" and quiet["events"] == 0


def test_bad_input_exits_2_before_any_rank_starts(tmp_path, capsys):
    from openclaw_ref.bench.gate.__main__ import main as gate_main

    assert gate_main(["no-such-commit-anywhere", "HEAD", "--repo", str(ROOT)]) == 2
    assert gate_main(["HEAD", "HEAD", "--jobs", "1"]) == 2
    assert gate_main(["HEAD", "HEAD", "--rounds", "2"]) == 2
    assert cal.main(["--runs", "0"]) == 2
    smoke = {"smoke": True, "complete": True}
    (tmp_path / cal.RECORD).write_text(json.dumps(smoke))
    assert cal.main(["--render", "--out", str(tmp_path)]) == 2  # a smoke run is never published
    assert "gate" in capsys.readouterr().err
