"""A partial ``openclaw-bench compare`` (``--sections`` naming some of the sections) merged into
the record already in its results directory, never written over it.

Why merge: the claims ledger's "regenerate with" column names partial runs (``compare
--sections faults``); a user who runs one expects that section refreshed and every other
table, plot and verdict kept, not a one-section record in place of the published one.

The invariants:

- A partial run replaces only the sections it ran; every other section of the record, with its
  figures, is kept as it was. The merged record is written atomically (``write_results``), and
  the plots and ledgers are rendered from it, so every file agrees with ``raw.json``.
- Each section measured by a later run than the record's own carries that run's environment
  (git SHA, date, versions), settings and placements in ``meta.section_runs[<section>]``; a
  section without an entry was measured by the run ``meta`` describes. Every rendered document
  names the sections measured apart (``reporting.comparison.provenance_notes``).
- A partial run whose settings or hardware differ from the record's is refused before any
  process starts (:func:`check_mergeable`), naming what differs. Why refuse rather than keep
  such sections apart with their own settings: every caption, plot axis and claim rule reads
  the one ``compare_config`` and host capacity of the record (repeats, world sizes, steps,
  cores); a section measured at other settings would be captioned and judged by settings it
  did not run with. Such a run belongs in its own directory (``--tag`` or ``--out-root``).
- A run of every section writes a fresh record (nothing to keep); so does a partial run into a
  directory without a record.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_ref.experiments.checkpoint import figure_settings
from openclaw_ref.experiments.registry import SECTIONS
from openclaw_ref.reporting.record import RAW_NAME, RunRecord, load_record
from openclaw_ref.sync.errors import BadInput

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig

# How the backend was spelled ("auto" or the one it resolves to) is no conflict: the
# environment's backend is compared instead (HARDWARE).
_SPELLING = ("backend",)
# The hardware a record's capacity (ranks ≤ cores, GPUs under NCCL) is judged from.
HARDWARE = ("backend", "cpu_count", "gpu_count", "gpu_models")


def is_partial(sections: tuple[str, ...] | list[str]) -> bool:
    """Whether a run of ``sections`` leaves some compare section out."""
    return not set(SECTIONS) <= set(sections)


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that shape figures (``checkpoint.figure_settings``), backend aside."""
    return {k: v for k, v in figure_settings(config).items() if k not in _SPELLING}


def conflicts(record: RunRecord, config: Mapping[str, Any],
              env: Mapping[str, Any]) -> list[str]:
    """What differs between a record and a run's settings (``config``: ``asdict`` of its
    ``CompareConfig``) and environment: one ``name: record's → run's``
    entry each. A setting the record does not hold (written before it existed) is no conflict."""
    ours, theirs = _settings(record.config), _settings(config)
    found = [f"{k}: {ours[k]} → {theirs[k]}" for k in sorted(set(ours) & set(theirs))
             if ours[k] != theirs[k]]
    recorded = record.meta["environment"]
    return found + [f"{k}: {recorded.get(k)} → {env.get(k)}" for k in HARDWARE
                    if k in recorded and recorded.get(k) != env.get(k)]


def existing_record(out_dir: Path) -> RunRecord | None:
    """The record in ``out_dir``, upgraded to this code's schema; None where there is none."""
    path = Path(out_dir) / RAW_NAME
    return load_record(path) if path.is_file() else None


def check_mergeable(cfg: CompareConfig, env: Mapping[str, Any]) -> None:
    """Refuse, before any process starts, a partial run that cannot merge into the record of
    its directory: an unreadable record, or settings or hardware that differ from it."""
    if not is_partial(cfg.sections):
        return
    record = existing_record(cfg.out_dir())
    if record is None:
        return
    found = conflicts(record, dataclasses.asdict(cfg), env)
    if found:
        raise BadInput(
            f"--sections {','.join(cfg.sections)} would merge into {cfg.out_dir() / RAW_NAME}, "
            f"whose other sections were measured with different settings ({'; '.join(found)}): "
            "a partial run keeps the record's settings. Rerun with the record's settings, "
            "every section, or write it elsewhere with --tag or --out-root")


def merge(record: RunRecord, partial: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with the sections ``partial`` ran replaced by its figures, each of them with
    its run's provenance in ``meta.section_runs``; a new document (neither input changes).
    BadInput if their settings or hardware differ (the record changed since the run began)."""
    run_meta = partial["meta"]
    found = conflicts(record, run_meta["compare_config"], run_meta["environment"])
    if found:
        raise BadInput(f"cannot merge into {record.source}/{RAW_NAME}: {'; '.join(found)}")
    out = copy.deepcopy(dict(record.doc))
    meta = out["meta"]
    ran = {entry["name"]: entry for entry in run_meta["sections_run"]}
    provenance = {k: run_meta[k] for k in ("environment", "compare_config", "placements")
                  if k in run_meta}
    apart = {k: v for k, v in meta.get("section_runs", {}).items() if k not in ran}
    for name, entry in ran.items():
        out[name] = copy.deepcopy(partial[name])
        apart[name] = copy.deepcopy({**provenance, "seconds": entry["seconds"]})
    kept = [e for e in meta.get("sections_run", []) if e["name"] not in ran]
    order = list(SECTIONS)
    meta["sections_run"] = sorted(kept + [dict(e) for e in ran.values()],
                                  key=lambda e: order.index(e["name"]) if e["name"] in order
                                  else len(order))
    skipped = {k: v for k, v in meta.get("sections_skipped", {}).items() if k not in ran}
    meta["sections_skipped"] = {**skipped, **run_meta.get("sections_skipped", {})}
    meta["section_runs"] = dict(sorted(apart.items()))
    if "doctor" in partial:
        out["doctor"] = copy.deepcopy(partial["doctor"])
    return out
