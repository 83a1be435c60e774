"""The calibration's plant seen from inside a gate job (slow: 2 gloo ranks, ~20 s): every rank
logs its timer's window around each step and every run of the planted busy-wait. The spin
runs exactly once per HEAD step, never in BASE's or stock DDP's, wholly inside the timed window,
for as long as planted — so nothing of a plant falls outside what the gate times, and no other
arm calls it. And a fast check that the planted lines spin for the planted µs."""

from __future__ import annotations

import dataclasses
import importlib
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from openclaw_ref.bench.gate import plant
from openclaw_ref.bench.gate.job import GateJobConfig, build_arms, order_of
from openclaw_ref.bench.gate.trees import Side, extract
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.experiments.interleave import interleaved_times
from tests.helpers import ROOT

GUARD = (ROOT / plant.PLANT_PATH).read_text()
US = 3000


def spin_lines(source: str) -> list[str]:
    """The lines ``with_busy_wait`` inserted."""
    lines = source.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "# planted: gate calibration" in line)
    return lines[at:at + 3]


def test_the_planted_lines_spin_for_the_planted_microseconds():
    code = textwrap.dedent("".join(spin_lines(plant.with_busy_wait(GUARD, US))))
    t0 = time.perf_counter()
    exec(code, {"time": time})  # the three lines as planted, nothing else
    assert US * 1e-6 <= time.perf_counter() - t0 < 1.0


def logged(source: str, us: int) -> str:
    """``plant.with_busy_wait`` plus a module-level log of each spin's (start, end)."""
    lines = plant.with_busy_wait(source, us).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "# planted: gate calibration" in line)
    pad = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 3, f"{pad}PLANT_LOG.append((_until - {us} * 1e-6, time.perf_counter()))\n")
    return "".join(lines) + "\nPLANT_LOG: list = []\n"


def logged_rank(ctx, cfg: GateJobConfig, head_module: str) -> dict:
    """A gate job whose every step is logged (step, start, end) by the same window the gate
    times (``interleaved_times`` calls the step between its two clock reads), and HEAD's
    plant log."""
    arms, steps = build_arms(ctx, cfg)
    windows: dict[str, list[tuple[int, float, float]]] = {arm: [] for arm in cfg.arms}

    def timed(arm, step_fn):
        def step(i: int) -> None:
            t0 = time.perf_counter()
            step_fn(i)
            windows[arm].append((i, t0, time.perf_counter()))
        return step
    try:
        interleaved_times({a: timed(a, f) for a, f in steps.items()}, cfg.arms, cfg.warmup,
                          cfg.rounds, ctx.device, order_of(cfg))
    finally:
        for _, state in arms.values():
            if state is not None:
                state.close()
    log = importlib.import_module(f"{head_module}.ddp.step_guard").PLANT_LOG
    return {"windows": windows, "plants": list(log)}


@pytest.mark.slow
def test_the_plant_runs_once_per_head_step_inside_the_timed_window_on_every_rank():
    with tempfile.TemporaryDirectory() as tmp:
        trees = [extract(ROOT, side, "HEAD", Path(tmp)) for side in (Side.BASE, Side.HEAD)]
        guard = Path(trees[1].root) / trees[1].module / "ddp" / "step_guard.py"
        guard.write_text(logged(guard.read_text(), US))
        cfg = GateJobConfig(sides=tuple((t.side.value, t.root, t.module) for t in trees),
                            rounds=12, warmup=3, stock_every=2)
        with RankPool(LaunchConfig(world_size=2, backend="gloo", threads_per_rank=1)) as pool:
            ranks = pool.run(logged_rank, dataclasses.replace(cfg, job=1), trees[1].module)
    for rank in ranks:
        windows, spins = rank["windows"], rank["plants"]
        assert len(windows["head"]) == cfg.warmup + cfg.rounds == len(spins)
        for start, end in spins:
            inside = [arm for arm, steps in windows.items()
                      for _, t0, t1 in steps if t0 <= start and end <= t1]
            assert inside == ["head"]  # in one HEAD step's window, no other arm's
            assert end - start >= US * 1e-6
        per_step = [sum(t0 <= s and e <= t1 for s, e in spins) for _, t0, t1 in windows["head"]]
        assert per_step == [1] * len(per_step)
