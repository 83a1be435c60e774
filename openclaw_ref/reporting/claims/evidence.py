"""Readers of the run record shared by the rules: sections, strategy runs, curves, paired repeats.

Every reader raises :class:`~.registry.Missing` naming the absent evidence instead of returning
an empty stand-in, so a rule never judges from nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from openclaw_ref.reporting.claims.registry import Missing
from openclaw_ref.reporting.record import RunRecord


def section(rec: RunRecord, name: str) -> dict:
    found = rec.section(name)
    if not found:
        raise Missing(f"{name} section not recorded")
    return dict(found)


def runs(rec: RunRecord, variant: str | None = None, w: int | None = None, *,
         failed: bool = False) -> list[dict]:
    """Strategy runs (successful ones unless ``failed``), optionally of one variant/size."""
    recorded = section(rec, "strategies").get("runs") or []
    if not recorded:
        raise Missing("strategies section recorded no runs")
    return [r for r in recorded if (("error" in r) == failed)
            and (variant is None or r["variant"] == variant)
            and (w is None or r["world_size"] == w)]


def multi_rank_sizes(rec: RunRecord) -> list[int]:
    """The world sizes ≥ 2 of the successful strategy runs, ascending."""
    return sorted({r["world_size"] for r in runs(rec) if r["world_size"] >= 2})


def repeat_values(chosen: list[dict], key: Callable[[dict], float | None]) -> dict[int, float]:
    return {r["repeat"]: v for r in chosen if (v := key(r)) is not None}


def paired(rec: RunRecord, num_variant: str, den_variant: str, w: int,
           key: Callable[[dict], float | None]) -> tuple[list[float], list[float]]:
    """Per-repeat values of two variants at one size, paired by repeat (interleaved runs)."""
    a = repeat_values(runs(rec, num_variant, w), key)
    b = repeat_values(runs(rec, den_variant, w), key)
    common = sorted(set(a) & set(b))
    return [a[i] for i in common], [b[i] for i in common]


def step_ms(r: dict) -> float:
    return r["summary"]["median_step_ms"]


def curve(rec: RunRecord, label: str | None = None) -> dict:
    """One recorded training curve: ``label``'s, or the first one recorded."""
    curves = section(rec, "curves")
    if label is None:
        return next(iter(curves.values()))
    if label not in curves:
        raise Missing(f"{label} curve not recorded")
    return curves[label]


def fault_cases(rec: RunRecord, **match: str) -> list[dict]:
    """Fault-matrix cases whose fields equal ``match`` (none when the matrix did not run)."""
    return [c for c in (rec.section("faults") or {}).get("cases", [])
            if all(c.get(k) == v for k, v in match.items())]


def precision_rows(rec: RunRecord) -> list[dict]:
    rows = section(rec, "precision").get("rows_data")
    if not rows:
        raise Missing("precision matrix empty")
    return rows


def as_ms(value: str) -> float | None:
    """'250ms' / '5.7ms' / '2s' in milliseconds; None when unparseable."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(ms|s)\s*", str(value))
    if not m:
        return None
    return float(m[1]) * (1e3 if m[2] == "s" else 1.0)


def pct(x: float) -> str:
    return f"{100 * x:.3g}%"
