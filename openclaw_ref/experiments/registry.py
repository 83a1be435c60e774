"""The sections of ``openclaw-bench compare``, in run order: name → what it measures, how many
progress ticks (jobs) it takes, its runner (``experiments.sections.<name>.run``) and the
seconds one of its jobs took on the reference machine (2 CPU cores, gloo, the default settings:
``results/cpu2-gloo``, 427 jobs in 1,321 s), from which ``compare`` says up front how long it
will take.

Adding a section: a module under ``experiments/sections/`` returning figures only (its
``CompareConfig`` and ``Progress`` come from ``experiments.settings``, never from the driver),
its name in ``sections.NAMES`` (the run order) and a line here, its tables in
``reporting.section_tables``, its key in ``reporting.record.SECTIONS`` and in
``cli.choices.SECTIONS`` (docs/layout.md).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments.sections import (
    ablations,
    corpus,
    curves,
    false_alarms,
    faults,
    fsdp_corpus,
    fsdp_cost,
    hook_cost,
    lightning,
    overflow,
    precision,
    quantization,
    raw_allreduce,
    sdc,
    strategies,
    tp_corpus,
)
from openclaw_ref.experiments.sections.strategies import Variant

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

Variants = tuple[Variant, ...]


class Section(NamedTuple):
    description: str
    jobs: Callable[[CompareConfig, Variants], int]  # progress ticks the section takes
    run: Callable[[CompareConfig, PoolCache, Progress, Variants], dict]  # its figures
    seconds_per_job: float  # on the reference machine at the default settings


def _plain(description: str, module: ModuleType, seconds_per_job: float) -> Section:
    """A section that runs the same whatever the variants (every one but ``strategies``)."""
    return Section(description, lambda cfg, variants: module.jobs(cfg),
                   lambda cfg, pools, progress, variants: module.run(cfg, pools, progress),
                   seconds_per_job)


SECTIONS: dict[str, Section] = {
    "strategies": Section("every strategy × world size, repeated",
                          strategies.jobs, strategies.run, 3.9),
    "curves": _plain("long loss/validation curves, ddp vs hardened", curves, 41.2),
    "faults": _plain("fault × hook outcome matrix (stock DDP, PyTorch's hooks, ours)", faults, 2.3),
    "corpus": _plain("published DDP silent errors × (ddp, ddp-detail, harden() defaults, K=1), "
                     "openclaw model and plain-MLP script", corpus, 0.6),
    "false_alarms": _plain("false-alarm corpus: pattern × (stock DDP, hardened) outcomes",
                           false_alarms, 0.3),
    "precision": _plain("text 004's precision × devices matrix", precision, 2.4),
    "overflow": _plain("fp16 overflow rate vs scale", overflow, 2.6),
    "raw_allreduce": _plain("raw flat allreduce of the same bytes", raw_allreduce, 0.1),
    "ablations": _plain("skew with the sparse path off; text 000's P2 barrier on vs off",
                        ablations, 5.5),
    "lightning": _plain("a short real Lightning run (text 004's L2/L4)", lightning, 14.7),
    "quantization": _plain("int8 quantization of a trained model on CPU (text 004's L4)",
                           quantization, 23.5),
    "hook_cost": _plain("hook cost per step and bucket (arms interleaved), verification at "
                        "scale", hook_cost, 36.8),
    "sdc": _plain("silent data corruption × (stock DDP, harden() canary off, on) at 2 and 4 "
                  "ranks, the canary's detection rates, healthy jobs on/off", sdc, 2.2),
    "fsdp_cost": _plain("harden() on FSDP2 beside stock fully_shard per step (arms "
                        "interleaved), 1-D and (dp, tp)", fsdp_cost, 104.0),
    # 3 jobs (1-D at 2 and 4 ranks, (dp, tp) at 4) in 312 s at load average 14-30, 2026-12-07;
    # the 2-rank job alone took 44.5 s at load average ~3
    "fsdp_corpus": _plain("published FSDP2 mistakes × (stock FSDP2, harden() defaults), "
                          "1-D at 2 ranks, HSDP at 4, torchrun", fsdp_corpus, 99.5),
    "tp_corpus": _plain("FSDP2 × tensor parallel: healthy set-ups and published TP/SP mistakes "
                        "× (stock, harden() defaults), 2-D at 4 ranks, 3-D at 8, torchrun",
                        tp_corpus, 73.0),  # measured at load average ~15
}


def expected_seconds(jobs: dict[str, int]) -> float:
    """How long ``jobs`` (section → job count) took on the reference machine."""
    return sum(n * SECTIONS[name].seconds_per_job for name, n in jobs.items())
