"""asv itself: ``asv run --python=same --quick`` at world sizes <= 2 saves a value for every
runnable benchmark (marker asv; `tox -e bench-smoke`). The harness's own pieces are tested in
test_bench_figures, test_bench_settings, test_bench_cache and test_bench_jobs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.bench.settings import STRATEGY_CASES
from tests.helpers import ROOT

SMOKE_ENV = {"OPENCLAW_BENCH_MAX_WORLD": "2", "OPENCLAW_BENCH_PRESET": "tiny",
             "OPENCLAW_BENCH_HOOK_STEPS": "5",
             "OPENCLAW_BENCH_STEPS": "3", "OPENCLAW_BENCH_GLOBAL_BATCH": "8",
             "OPENCLAW_BENCH_RAW_ITERS": "2", "OPENCLAW_BENCH_ROUNDS": "1"}


def _head_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@pytest.mark.asv
def test_asv_quick_smoke_on_two_ranks_saves_a_value_for_every_runnable_benchmark(tmp_path):
    """``asv run --python=same --quick`` at world sizes ≤ 2, into a scratch results dir (HOME is
    scratch too: asv keeps its machine file there)."""
    pytest.importorskip("asv")
    asv = shutil.which("asv", path=os.path.dirname(sys.executable)) or shutil.which("asv")
    sha = _head_sha()
    if asv is None or sha is None:
        pytest.skip("needs the asv command and a git checkout")
    conf = json.loads("\n".join(line for line in (ROOT / "benchmarks" / "asv.conf.json")
                                .read_text().splitlines() if not line.lstrip().startswith("//")))
    assert conf["results_dir"].startswith(".asv") and conf["html_dir"].startswith(".asv")
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, timeout=10).stdout.strip()
    if branch and branch != "HEAD":
        conf["branches"] = [branch]  # a clone on another branch still finds its commit
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks" / "benchmarks"),
                results_dir=str(tmp_path / "results"), html_dir=str(tmp_path / "html"),
                env_dir=str(tmp_path / "env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    env = {**os.environ, **SMOKE_ENV, "HOME": str(tmp_path), "ASV_PYTHONPATH": str(ROOT)}
    common = ["--config", str(tmp_path / "asv.conf.json")]
    subprocess.run([asv, "machine", "--yes", "--machine", "smoke", *common], env=env,
                   check=True, capture_output=True, timeout=60)
    run = subprocess.run([asv, "run", "--python=same", "--quick", "--set-commit-hash", sha,
                          "--machine", "smoke", "--show-stderr", *common],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    [result_file] = [p for p in (tmp_path / "results" / "smoke").glob("*.json")
                     if p.name != "machine.json"]
    results = json.loads(result_file.read_text())["results"]
    assert "failed" not in run.stdout.lower(), run.stdout[-4000:]

    def values(name):
        return results[name][0]

    # ddp at 1 and 2 ranks: every step figure is a number
    step = values("bench_sync.SyncStep.track_median_step_ms")
    strategies = list(STRATEGY_CASES)
    ddp = strategies.index("ddp")
    assert all(v is not None and v > 0 for v in step[ddp * 2: ddp * 2 + 2])
    busbw = values("bench_sync.RawAllreduce.track_busbw")
    assert busbw[ddp * 2 + 1] > 0  # 2 ranks
    s_per_iter = values("bench_seed004.Seed004Matrix.track_s_per_iter")
    assert all(v is not None and v > 0 for v in s_per_iter)
    # a strategy that is not registered is skipped (n/a), never given a number
    for i, label in enumerate(strategies):
        if STRATEGY_CASES[label]["name"] not in STRATEGIES:
            assert step[2 * i] is None or math.isnan(step[2 * i])
    # the gate figures: a ratio per model from the interleaved job; verification timed at W
    gate = values("bench_hooks.HookCost.track_hardened_over_ddp")
    assert len(gate) == 2 and all(v is not None and v > 0 for v in gate)
    over_floor = values("bench_hooks.HookCost.track_hardened_over_floor")
    assert len(over_floor) == 2 and all(v is not None and v > 0 for v in over_floor)
    # mlp at 1 and 2 ranks × tp 1 and 2: the 1-D mesh measured, (dp, tp) skipped (needs 4 ranks)
    fsdp = values("bench_hooks.FSDPCost.track_hardened_over_stock")
    assert len(fsdp) == 4 and all(v is not None and v > 0 for v in fsdp[::2])
    assert all(v is None or math.isnan(v) for v in fsdp[1::2])
    assert all(v is not None and v > 0
               for v in values("bench_hooks.VerifyScale.time_check_blocks_16_buckets"))
