"""Checkpoints of ``openclaw-bench compare``: each finished section's figures, written atomically
to ``<out_dir>/.partial/<section>.json`` beside the configuration that produced them, so an
interrupted run resumes (``--resume``) without running them again.

Invariant: figures are reused only under the configuration and code (git SHA) that produced
them; a checkpoint from anything else is refused (bad input), never mixed into a result. The
published files beside ``.partial/`` are untouched until the whole run is written, and the
checkpoints are removed once it is.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from openclaw_ref.core.environment import git_sha
from openclaw_ref.core.jsonio import read_json, write_json_atomic
from openclaw_ref.sync.errors import BadInput

if TYPE_CHECKING:
    from openclaw_ref.experiments.sections.strategies import Variant
    from openclaw_ref.experiments.settings import CompareConfig

PARTIAL_DIR = ".partial"
# Where the results go and which sections run do not change any one section's figures.
_NOT_IN_FINGERPRINT = ("sections", "out_root", "tag")


def figure_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The compare settings (``asdict`` of a ``CompareConfig``, or a record's copy) that shape
    a section's figures, as JSON holds them (tuples as lists): the one definition the
    ``--resume`` fingerprint and the partial-run merge (``merge.conflicts``) compare."""
    return json.loads(json.dumps({k: v for k, v in config.items()
                                  if k not in _NOT_IN_FINGERPRINT}))


def fingerprint(cfg: CompareConfig, variants: tuple[Variant, ...]) -> dict[str, Any]:
    """What a section's figures depend on, as JSON would hold it."""
    return json.loads(json.dumps({
        "compare_config": figure_settings(dataclasses.asdict(cfg)),
        "variants": [[v.label, dataclasses.asdict(v.sync)] for v in variants],
        "git_sha": git_sha(),
    }))


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The names of what differs between two fingerprints (config fields, variants, git_sha)."""
    old_config, new_config = old.get("compare_config", {}), new["compare_config"]
    found = [k for k in sorted(set(old_config) | set(new_config))
             if old_config.get(k) != new_config.get(k)]
    return found + [k for k in ("variants", "git_sha") if old.get(k) != new[k]]


def discard(out_dir: Path) -> None:
    """Remove every checkpoint of ``out_dir`` (a fresh run starts; a written run is done)."""
    shutil.rmtree(Path(out_dir) / PARTIAL_DIR, ignore_errors=True)


class Finished(NamedTuple):
    figures: Any
    seconds: float


class Checkpoints:
    """The finished sections of one compare run (one ``out_dir``, one fingerprint)."""

    def __init__(self, out_dir: Path, made_by: dict[str, Any]) -> None:
        self.dir = Path(out_dir) / PARTIAL_DIR
        self.fingerprint = made_by  # see ``fingerprint``

    def load(self) -> dict[str, Finished]:
        """Every checkpoint here, by section; BadInput if any came from another configuration."""
        found = {}
        for path in sorted(self.dir.glob("*.json")):
            doc = read_json(path)
            if doc.get("fingerprint") != self.fingerprint:
                changed = _differences(doc.get("fingerprint") or {}, self.fingerprint)
                raise BadInput(f"--resume: {path} was made with a different {', '.join(changed)}; "
                               f"run with the same options, or without --resume to start afresh")
            found[path.stem] = Finished(doc["figures"], doc["seconds"])
        return found

    def save(self, section: str, figures: Any, seconds: float) -> None:
        write_json_atomic(self.dir / f"{section}.json", {
            "fingerprint": self.fingerprint, "figures": figures, "seconds": seconds},
            compact=True)

