"""The sections of ``openclaw-bench compare``, in run order: name → what it measures, how many
progress ticks it takes, and its runner (``experiments.sections.<name>.run``).

Adding a section: a module under ``experiments/sections/`` returning figures only, a line here,
its tables in ``reporting.section_tables``, its key in ``reporting.record.SECTIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments.sections import (
    ablations,
    curves,
    faults,
    hook_cost,
    lightning,
    overflow,
    precision,
    quantization,
    raw_allreduce,
    strategies,
)
from openclaw_ref.experiments.sections.strategies import Variant

if TYPE_CHECKING:
    from openclaw_ref.experiments.compare import CompareConfig, Progress

Variants = tuple[Variant, ...]


class Section(NamedTuple):
    description: str
    jobs: Callable[[CompareConfig, Variants], int]  # progress ticks the section takes
    run: Callable[[CompareConfig, PoolCache, Progress, Variants], dict]  # its figures


def _plain(description: str, module: ModuleType) -> Section:
    """A section that runs the same whatever the variants (every one but ``strategies``)."""
    return Section(description, lambda cfg, variants: module.jobs(cfg),
                   lambda cfg, pools, progress, variants: module.run(cfg, pools, progress))


SECTIONS: dict[str, Section] = {
    "strategies": Section("every strategy × world size, repeated",
                          strategies.jobs, strategies.run),
    "curves": _plain("long loss/validation curves, ddp vs hardened", curves),
    "faults": _plain("fault × strategy outcome matrix", faults),
    "precision": _plain("seed 004's precision × devices matrix", precision),
    "overflow": _plain("fp16 overflow rate vs scale", overflow),
    "raw_allreduce": _plain("raw flat allreduce of the same bytes", raw_allreduce),
    "ablations": _plain("skew with the sparse path off; the seed's P2 barrier on vs off",
                        ablations),
    "lightning": _plain("a short real Lightning run (seed 004's L2/L4)", lightning),
    "quantization": _plain("int8 quantization of a trained model on CPU (seed 004's L4)",
                           quantization),
    "hook_cost": _plain("hook cost per step and bucket (arms interleaved), verification at "
                        "scale", hook_cost),
}
