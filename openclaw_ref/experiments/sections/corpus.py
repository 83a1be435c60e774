"""Section ``corpus``: the published DDP silent-error patterns × (stock DDP, ``ddp-detail``,
``harden()`` defaults, ``harden()`` with K=1), on the openclaw model and on the plain-model user
script ``conformance/silent_errors_script.py`` (2 ranks each), with each pattern's public
source. ``compare --quick`` runs ``QUICK_PATTERNS``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from openclaw_ref.conformance.corpus import (
    SCRIPT_STEPS,
    Column,
    CorpusRunner,
    CorpusSettings,
    steps_to_detect,
)
from openclaw_ref.core.corpus_faults import CORPUS, Pattern
from openclaw_ref.core.pools import PoolCache

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

MODELS = ("openclaw", "plain-mlp")
# ``compare --quick``: one pattern each that harden() names at once (the gradients were never
# averaged) and that it names within its replica window
QUICK_PATTERNS = ("forward-via-module", "clip-one-rank")


def patterns_of(cfg: CompareConfig) -> tuple[Pattern, ...]:
    return tuple(p for p in CORPUS if p.name in QUICK_PATTERNS) if cfg.quick else CORPUS


def jobs(cfg: CompareConfig) -> int:
    return len(MODELS) * len(Column) * len(patterns_of(cfg))


def _cases(runner: CorpusRunner, model: str, patterns: tuple[Pattern, ...],
           progress: Progress) -> list[dict]:
    cases = []
    for column in Column:
        for p in patterns:
            out = runner.run_case(column, p.name)
            cases.append({**out.to_json(), "model": model, "column": column.value,
                          "pattern": p.name, "steps_to_detect": steps_to_detect(out, p)})
            progress.tick(f"corpus {model} {p.name} × {column.value}")
    return cases


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """Every pattern × column on both models; each column's clean run is its reference."""
    settings = CorpusSettings()
    patterns = patterns_of(cfg)
    cases = []
    for model in MODELS:
        runner = CorpusRunner(settings, pools.get, script=model == "plain-mlp")
        cases += _cases(runner, model, patterns, progress)
    return {"settings": {**dataclasses.asdict(settings), "script_steps": SCRIPT_STEPS},
            "patterns": [dataclasses.asdict(p) for p in patterns], "cases": cases}
