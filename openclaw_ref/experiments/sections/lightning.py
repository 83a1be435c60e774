"""Section ``lightning``: a real short Lightning run (seed 004's L2/L4) — DDP on
``lightning_devices`` devices, mixed precision, seeded, class-balanced — in its own session
(Lightning's launcher re-executes it per rank), killed afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_ref.core.pools import PoolCache

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

TIMEOUT_S = 600


def jobs(cfg: CompareConfig) -> int:
    return 1


def lightning_command(cfg: CompareConfig, out: Path) -> list[str]:
    """The Lightning runner as seed 004 sets it up: DDP on ``lightning_devices`` devices, mixed
    precision (fp16 where the runner puts every device on a GPU, else bf16 on the CPU — one GPU
    and two devices train on the CPU), seeded, class-balanced by a WeightedRandomSampler over
    deliberately imbalanced labels; stock DDP (``--sync ddp``) under Lightning's DDP."""
    from openclaw_ref.integrations.lightning.runner import all_on_gpus

    precision = "16-mixed" if all_on_gpus(cfg.lightning_devices) else "bf16-mixed"
    return [sys.executable, "-m", "openclaw_ref.integrations.lightning", "--devices",
            str(cfg.lightning_devices), "--max-steps", str(cfg.lightning_steps),
            "--precision", precision, "--sync", "ddp", "--seed", str(cfg.seed), "--balance",
            "--imbalance", "4", "--out", str(out)]


def _lightning_flags(result: dict, balance: bool) -> tuple[bool | None, bool | None, str]:
    """(seed_everything(workers=True) ran, WeightedRandomSampler drew the batches, how known):
    from the runner's result when it reports them, else read from what the runner runs."""
    if "seed_everything_workers" in result and "weighted_sampler" in result:
        return bool(result["seed_everything_workers"]), bool(result["weighted_sampler"]), \
            "runner result"
    import inspect

    from torch.utils.data import WeightedRandomSampler

    from openclaw_ref.core.model import preset
    from openclaw_ref.integrations import lightning as lt

    source = inspect.getsource(lt.run_lightning)
    workers = "seed_everything(" in source and "workers=True" in source
    dm = lt.SkillDataModule(preset("tiny", seed=1), balance=balance, seed=1)
    sampler = isinstance(dm.train_dataloader().sampler, WeightedRandomSampler)
    return workers, sampler, ("run_lightning's source (seed_everything call); the data "
                              "module's train loader (sampler type)")


def _run_session(cmd: list[str], out: Path) -> tuple[int | None, str, float, dict]:
    """(exit code, log, wall seconds, the runner's result or {}) of ``cmd`` in its own session,
    every process of which is killed afterwards (Lightning's other ranks live in there)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("MASTER_PORT", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log = f"timed out after {TIMEOUT_S} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    wall_s = time.monotonic() - t0
    result = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, log, wall_s, result


def run(cfg: CompareConfig, pools: PoolCache | None, progress: Progress) -> dict:
    """``python -m openclaw_ref.integrations.lightning`` once; its figures, or its error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lightning.json"
        cmd = lightning_command(cfg, out)
        code, log, wall_s, result = _run_session(cmd, out)
    progress.tick("lightning run")
    command = " ".join(["python"] + cmd[1:-2])
    if code != 0 or not result:
        return {"error": f"exit {code}: {log[-800:]}", "command": command}
    workers, sampler, known = _lightning_flags(result, "--balance" in cmd)
    return {
        "accelerator": result.get("accelerator"), "devices": result.get("world_size"),
        "precision": result.get("precision"),
        "strategy": "ddp (Lightning DDPStrategy subclass SyncDDPStrategy, stock DDP wrapper)",
        "steps": result.get("steps"), "steps_per_s": result.get("steps_per_s"),
        "median_step_ms": result.get("median_step_ms"), "final_loss": result.get("final_loss"),
        "skipped_steps": result.get("skipped_steps"), "events": len(result.get("events") or []),
        "seed_everything_workers": workers, "weighted_sampler": sampler,
        "flags_from": known, "wall_s": round(wall_s, 1), "command": command,
    }
