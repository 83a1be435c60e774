"""The ``corpus`` section's tables: published DDP silent errors × column, one table per model
(the openclaw model; the plain-MLP user script), each pattern's source cited beside it, and the
wording of every cell (outcome, the check that fired, steps until detected) made here from the
record's figures alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openclaw_ref.reporting.table import Table

Figures = Mapping[str, Any]

COLUMN_TITLES = {"ddp": "stock DDP", "ddp-detail": "ddp-detail (DETAIL)",
                 "hardened": "harden() defaults", "hardened-k1": "harden() K=1"}
MODEL_TITLES = {"openclaw": "the openclaw model (tiny preset, the training loop)",
                "plain-mlp": ("a plain 4-layer MLP user script "
                              "(conformance/silent_errors_script.py)")}


def corpus_cell(case: Figures) -> str:
    """An outcome in words: ``detected`` with the check, the step count until it fired and the
    ranks it named; any other outcome as the fault matrix names it."""
    if case["outcome"] != "detected":
        return case["outcome"]
    parts = [case["kind"]]
    n = case.get("steps_to_detect")
    if n is not None:
        parts.append("same step" if n == 0 else f"+{n} step{'s' if n != 1 else ''}")
    else:
        parts.append("at construction")
    if case.get("ranks"):
        parts.append("ranks " + ",".join(str(r) for r in case["ranks"]))
    return f"detected ({'; '.join(parts)})"


def _source(p: Figures) -> str:
    return f"[{p['source']}]({p['url']})"


def corpus_tables(sec: Figures, cfg: Figures) -> list:
    st, patterns, cases = sec["settings"], sec["patterns"], sec["cases"]
    columns = list(dict.fromkeys(c["column"] for c in cases))
    tables = []
    for model in dict.fromkeys(c["model"] for c in cases):
        cell = {(c["pattern"], c["column"]): corpus_cell(c) for c in cases if c["model"] == model}
        steps = st["train"]["steps"] if model == "openclaw" else st["script_steps"]
        caught = {col: sum(1 for p in patterns if cell.get((p["name"], col), "")
                           .startswith("detected")) for col in columns}
        tables.append(Table(
            f"Published DDP silent errors on {MODEL_TITLES.get(model, model)}: {steps}-step runs "
            f"on {st['world_size']} gloo ranks; a one-rank pattern acts on one rank from step 2 "
            "(construction-time ones from the start). Outcome: detected (the check, steps "
            "after the fault took effect, ranks named) / silent-corruption (replicas differ, "
            "or the result differs from the same column's clean run) / crash / hang-timeout / "
            "no-effect. Caught: "
            + ", ".join(f"{COLUMN_TITLES.get(c, c)} {caught[c]} of {len(patterns)}"
                        for c in columns) + ".",
            ["pattern", "source"] + [COLUMN_TITLES.get(c, c) for c in columns],
            [[p["name"], _source(p)] + [cell.get((p["name"], c), "") for c in columns]
             for p in patterns]))
    return tables
