"""The run record: one typed, versioned definition of ``raw.json``.

``compare`` writes it; ``report``, ``claims`` and ``plots`` read it only through
:func:`load_record` / :func:`parse_record`, which validate it first, so a malformed or
foreign file fails with one clear message instead of a ``KeyError`` deep inside a renderer.

Versions:

- 1: the layout before versioning (no ``schema_version`` field). Read as version 2 unchanged:
  every field version 2 adds is optional and absent in it, so nothing is invented.
- 2: adds ``schema_version``, the ``doctor`` section (the lint of text 000's NCCL settings) and
  ``ablations.skew_barrier_repeats`` (per-repeat figures of the P2 barrier arms).
- 3: written compact (no whitespace, floats to 6 significant digits). Adds
  ``overflow.scale_mismatch`` (M4: rank-dependent pre-scale, per size and workload),
  ``overflow.rates`` at 8 ranks, fault-matrix cases of strategy ``seed-f5`` (with fault
  ``none``), ``precision.rows_data[].s_per_iter_repeats``, ``summary.peak_memory_scope`` of
  each run, and the ``lightning`` and ``quantization`` sections. Strategy runs no longer
  carry ``rank_step_ms``, ``applied``, ``missing_grads``, ``skew_ms`` (``skew_p50_ms`` and
  ``skew_p99_ms`` stay), ``realized_sparsity`` and ``mask_entropy_bits`` (curves keep the
  last three), and keep the gradient norms of ``layer.3.attn.v_proj.weight`` only (curves:
  both seed-named parameters). Versions 1 and 2 are read unchanged: every field 3 adds is
  optional, and the rules read the dropped ones only where 3 keeps them (C3 falls back to
  ``skew_ms`` in older records).
- 4: figures only. No section carries ``tables`` (captions and formatted rows); every table
  is built by ``reporting.section_tables`` from figures. Adds ``raw_allreduce.elements`` and
  ``raw_allreduce.iterations``, ``hook_cost.jobs.<model>.baseline`` and
  ``ablations.sparsity_arms`` (the arms' run order; the record's keys are sorted), the
  figures that only the old tables held. Versions 1 to 3 are upgraded on load by
  :func:`upgrade`, which drops the tables and recovers those figures from them; no figure
  changes. ``meta.compare_config.quick`` (optional; absent = false) marks a ``compare --quick``
  record, which every rendered file labels as a quick run. ``meta.section_runs`` (optional;
  absent = none): per section measured by a later, partial compare merged into the record
  (``experiments.merge``), that run's ``environment``, ``compare_config``, ``placements`` and
  the section's ``seconds``; a section without an entry was measured by the run ``meta``
  describes. ``fsdp_cost`` (optional; absent = not run): harden() on FSDP2 beside stock
  ``fully_shard``, one interleaved job per model (``experiments.fsdp_cost.job_figures``;
  keyed by job since version 7).
  ``fsdp_corpus`` (optional; absent = not run): the published FSDP2 mistakes under stock FSDP2
  and ``harden()``'s defaults, per pattern × column the outcome, error class, step and ranks
  named (``experiments.sections.fsdp_corpus.case_figures``). ``sync_last.buckets[].elements``
  (optional; absent = not recorded): each bucket's gradient elements on the wire, beside its
  ready times (the bucket timeline's legend). ``sdc`` (optional; absent = not run): the
  silent-data-corruption corpus under stock DDP and ``harden()`` with the compute canary off and
  on, its detection rates and the healthy jobs (``experiments.sections.sdc``).
- 5: each hook-cost job carries ``pairs``, the ratios between two arms of the job (``arm``,
  ``over``, ``ratio``, ``ratio_low``, ``ratio_high``; ``experiments.hook_cost.RATIO_PAIRS``), in
  place of each hardened arm's ``vs_python_hook``, ``vs_python_hook_ratio``, ``_low`` and
  ``_high`` in its summary; new arms ``floor`` (stock DDP plus one bare exchange of the step
  guard's bytes) and ``hardened+canary`` may appear. Versions 1 to 4 are upgraded on load: the
  ``vs_python_hook`` figures become pairs, unchanged.
- 6: the compute canary confirms a mismatch before raising, so ``sdc.rates[]`` counts
  ``named`` (raised), ``reported`` (a ``CanaryTransient`` event naming the faulty rank),
  ``right_rank`` and ``wrong_rank`` in place of ``detected``; ``sdc.noise`` (optional) is the
  tolerance's table (``experiments.canary_noise``); hook-cost arms may carry
  ``probe_held_bytes``. Version 5 is upgraded on load: a canary that raised on every mismatch
  ``named`` what it ``detected``, ``reported`` nothing, and named the wrong rank on
  ``detected − right_rank`` probes. ``tp_corpus`` (optional; absent = not run): FSDP2 × tensor
  parallel, healthy set-ups and published TP/SP mistakes under the script as written and
  ``harden()``'s defaults, per case × column the outcome, error class, step, ranks and
  parameters named, the replica drift (``experiments.sections.tp_corpus.case_figures``).
- 7: ``fsdp_cost`` runs one job per mesh and world size: its ``jobs`` are keyed by
  :func:`fsdp_cost_job_key` (``mlp-2r``, ``mlp-4r``, ``mlp-4r-tp2``) in place of the model, and
  each job's ``config.tp`` is its tensor-parallel degree (1: the 1-D mesh; 2: a (dp, tp) mesh,
  ``experiments.fsdp_cost``); a job may carry ``event_kinds`` (its ``events`` by kind) and
  ``load_average`` (the host's 1-minute load average before and after it). Versions 1 to 6
  are upgraded on load: each of their jobs ran on the 1-D mesh, so it gets ``tp`` 1 and its
  key; no figure changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_ref.sync.errors import BadInput

RAW_NAME = "raw.json"  # the record's file name in every results/<machine>/ directory
SCHEMA_VERSION = 7
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
REGENERATE = "regenerate it with `openclaw-bench compare`"

# Every top-level key a record may hold besides ``schema_version`` and ``meta``.
SECTIONS = ("strategies", "curves", "faults", "corpus", "false_alarms", "precision", "overflow",
            "raw_allreduce", "ablations", "doctor", "lightning", "quantization", "hook_cost",
            "fsdp_cost", "fsdp_corpus", "sdc", "tp_corpus")


class RecordError(BadInput):
    """``raw.json`` is not a run record this code can read; the message says what to do."""


@dataclass(frozen=True)
class Environment:
    """What the comparison ran on: the facts a hardware-honest verdict is decided from."""

    backend: str
    cpu_count: int
    gpu_count: int
    gpu_models: tuple[str, ...]
    nccl: str | None
    cuda: str | None
    torch: str
    cpu_model: str
    git_sha: str
    date: str

    @property
    def capacity(self) -> int:
        """Ranks that can run at once without sharing a device: GPUs under NCCL, else cores.
        Timing and skew are judged only at world sizes up to this."""
        return self.gpu_count if self.backend == "nccl" else self.cpu_count

    def describe(self) -> str:
        gpus = f"{self.gpu_count} GPUs" + (f" ({', '.join(self.gpu_models)})"
                                           if self.gpu_models else "")
        return (f"{self.cpu_count} CPU cores ({self.cpu_model}), {gpus}, torch {self.torch}, "
                f"backend {self.backend}, NCCL {self.nccl or 'none'}")


@dataclass(frozen=True)
class RunRecord:
    """A validated ``raw.json``. ``doc`` is the document itself (read-only by convention);
    ``source`` names the machine directory it came from; ``upgraded_from`` is the version
    read when it was older than :data:`SCHEMA_VERSION`."""

    schema_version: int
    environment: Environment
    doc: Mapping[str, Any]
    source: str = "<memory>"
    upgraded_from: int | None = None

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.doc["meta"]

    @property
    def config(self) -> Mapping[str, Any]:
        return self.doc["meta"]["compare_config"]

    @property
    def quick(self) -> bool:
        """A ``compare --quick`` record: a subset of every section at small settings, which
        shows what the comparison produces but whose figures are not results."""
        return bool(self.config.get("quick", False))

    @property
    def section_runs(self) -> Mapping[str, Mapping[str, Any]]:
        """The sections measured apart from the run ``meta`` describes (merged in by a partial
        compare), each with its own run's environment and settings; empty for one run."""
        return self.doc["meta"].get("section_runs") or {}

    def section(self, name: str) -> Mapping[str, Any] | None:
        """The named section, or None when it did not run (empty counts as not run)."""
        if name not in SECTIONS:
            raise KeyError(f"unknown section {name!r}")
        return self.doc.get(name) or None


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise RecordError(f"{where}: {what}; {REGENERATE}")


def _version(doc: Mapping[str, Any], where: str) -> int:
    """The document's schema version; a missing one means version 1 if the layout is v1's."""
    if "schema_version" not in doc:
        meta = doc.get("meta")
        _need(isinstance(meta, dict) and "environment" in meta and "compare_config" in meta,
              where, "no schema_version and not a version-1 comparison record")
        return 1
    v = doc["schema_version"]
    _need(isinstance(v, int) and v in READABLE_VERSIONS, where,
          f"schema_version {v!r} is not one this code reads {READABLE_VERSIONS} (this code "
          f"writes {SCHEMA_VERSION}; a newer record needs a newer openclaw-sync)")
    return v


def _environment(meta: Mapping[str, Any], where: str) -> Environment:
    env = meta.get("environment")
    _need(isinstance(env, dict), where, "meta.environment missing")
    for key, kind in (("backend", str), ("cpu_count", int), ("gpu_count", int), ("torch", str)):
        _need(isinstance(env.get(key), kind), where,
              f"meta.environment.{key} must be {kind.__name__}, got {env.get(key)!r}")
    _need(env["cpu_count"] >= 1 and env["gpu_count"] >= 0, where, "impossible core/GPU count")
    return Environment(backend=env["backend"], cpu_count=env["cpu_count"],
                       gpu_count=env["gpu_count"], gpu_models=tuple(env.get("gpu_models") or ()),
                       nccl=env.get("nccl"), cuda=env.get("cuda"), torch=env["torch"],
                       cpu_model=str(env.get("cpu_model", "?")),
                       git_sha=str(env.get("git_sha", "unknown")), date=str(env.get("date", "?")))


def _check_runs(doc: Mapping[str, Any], where: str) -> None:
    runs = (doc.get("strategies") or {}).get("runs", [])
    _need(isinstance(runs, list), where, "strategies.runs must be a list")
    for i, r in enumerate(runs):
        at = f"strategies.runs[{i}]"
        _need(isinstance(r, dict) and isinstance(r.get("variant"), str)
              and isinstance(r.get("world_size"), int) and isinstance(r.get("repeat"), int),
              where, f"{at} needs variant (str), world_size and repeat (int)")
        if "error" not in r:
            _need(isinstance(r.get("summary"), dict) and isinstance(r.get("step_ms"), list),
                  where, f"{at} ran but has no summary/step_ms")


def _check_counts(doc: Mapping[str, Any], where: str) -> None:
    """The integer rows the M4 rule divides: a string or a float there is a foreign file."""
    rows = (doc.get("overflow") or {}).get("scale_mismatch", [])
    _need(isinstance(rows, list), where, "overflow.scale_mismatch must be a list")
    for i, r in enumerate(rows):
        _need(isinstance(r, dict) and all(isinstance(r.get(k), int) for k in
                                          ("world_size", "allreduces", "overflowed", "corrupted")),
              where, f"overflow.scale_mismatch[{i}] needs integer world_size, allreduces, "
                     "overflowed, corrupted")


def _raw_allreduce_figures(section: Mapping[str, Any]) -> dict[str, Any]:
    """The element count and iterations of a version ≤ 3 ``raw_allreduce`` section: read from
    its table's caption ("all N gradient elements …, median of K"), else the element count from
    an fp32 row's bytes and the 20 iterations every such record ran."""
    caption = " ".join(t.get("caption", "") for t in section.get("tables", []))
    elements = re.search(r"all (\d+) gradient elements", caption)
    iterations = re.search(r"median of (\d+)", caption)
    fp32 = [r["bytes"] // 4 for r in section.get("rows_data", []) if r.get("wire") == "fp32"]
    return {"elements": int(elements.group(1)) if elements else (fp32[0] if fp32 else None),
            "iterations": int(iterations.group(1)) if iterations else 20}


def _baseline(job: Mapping[str, Any], tables: list[Mapping[str, Any]], model: str) -> str:
    """The baseline arm of a version ≤ 3 hook-cost job: the row of its table with no extra
    cost per bucket (the table whose caption names the model), else stock ``ddp``."""
    for t in tables:
        if f"model {model} (" in t.get("caption", ""):
            return next((row[0] for row in t["rows"] if row[3] == ""), "ddp")
    return "ddp"


def _sparsity_arms(section: Mapping[str, Any]) -> list[str]:
    """The order a version ≤ 3 ablation ran its sparsity arms in: its skew table's first
    column (the record's keys are sorted), else the keys as stored."""
    for t in section.get("tables", []):
        if t.get("headers", [None])[0] == "gating":
            return [row[0] for row in t["rows"]]
    return list(section.get("sparsity", {}))


PYTHON_HOOK_FIELDS = ("vs_python_hook", "vs_python_hook_ratio", "vs_python_hook_low",
                      "vs_python_hook_high")


def _with_pairs(job: Mapping[str, Any]) -> dict[str, Any]:
    """A version ≤ 4 hook-cost job as version 5's: each arm's ``vs_python_hook`` figures moved,
    unchanged, into the job's ``pairs`` (in the job's arm order)."""
    summary = job.get("summary", {})
    order = [a for a in job.get("config", {}).get("arms", summary) if a in summary]
    pairs = [{"arm": arm, "over": summary[arm]["vs_python_hook"],
              "ratio": summary[arm]["vs_python_hook_ratio"],
              "ratio_low": summary[arm]["vs_python_hook_low"],
              "ratio_high": summary[arm]["vs_python_hook_high"]}
             for arm in order if "vs_python_hook" in summary[arm]]
    return {**job, "pairs": pairs,
            "summary": {arm: {k: v for k, v in figures.items() if k not in PYTHON_HOOK_FIELDS}
                        for arm, figures in summary.items()}}


def upgrade(doc: Mapping[str, Any], version: int) -> dict[str, Any]:
    """A version-``version`` document as version :data:`SCHEMA_VERSION` (a new document; the
    given one is not changed): every section's ``tables`` dropped, the figures only they held
    recovered (``raw_allreduce.elements``/``iterations``, ``hook_cost.jobs.*.baseline``,
    ``ablations.sparsity_arms``); a hook-cost job's ratios to PyTorch's hooks moved into its
    ``pairs``."""
    out = dict(doc)
    for name in SECTIONS:
        if isinstance(out.get(name), dict):
            out[name] = {k: v for k, v in out[name].items() if k != "tables"}
    if version < 4 and isinstance(doc.get("raw_allreduce"), dict):
        out["raw_allreduce"].update(_raw_allreduce_figures(doc["raw_allreduce"]))
    if version < 4 and isinstance(doc.get("ablations"), dict):
        out["ablations"]["sparsity_arms"] = _sparsity_arms(doc["ablations"])
    if version < 4 and isinstance(doc.get("hook_cost"), dict):
        tables = doc["hook_cost"].get("tables", [])
        out["hook_cost"]["jobs"] = {
            model: {**job, "baseline": _baseline(job, tables, model)}
            for model, job in doc["hook_cost"].get("jobs", {}).items()}
    if version < 5 and isinstance(out.get("hook_cost"), dict):
        out["hook_cost"]["jobs"] = {model: _with_pairs(job) for model, job
                                    in out["hook_cost"].get("jobs", {}).items()}
    if version < 6 and isinstance(out.get("sdc"), dict):
        out["sdc"] = {**out["sdc"], "rates": [_confirmed_rate(r)
                                              for r in out["sdc"].get("rates", [])]}
    if version < 7 and isinstance(out.get("fsdp_cost"), dict):
        out["fsdp_cost"] = {**out["fsdp_cost"], "jobs": dict(
            _one_d_fsdp_cost_job(job) for job in out["fsdp_cost"].get("jobs", {}).values())}
    if "schema_version" in out:
        out["schema_version"] = SCHEMA_VERSION
    return out


def fsdp_cost_job_key(model: str, world_size: int, tp: int) -> str:
    """An ``fsdp_cost`` job's key: its model, ranks and, on a (dp, tp) mesh, its tp degree."""
    return f"{model}-{world_size}r" + (f"-tp{tp}" if tp > 1 else "")


def _one_d_fsdp_cost_job(job: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A version ≤ 6 ``fsdp_cost`` job (the 1-D mesh) as version 7's: (its key, the job with
    ``config.tp`` 1)."""
    config = {**job["config"], "tp": 1}
    return (fsdp_cost_job_key(config["model"], config["world_size"], 1),
            {**job, "config": config})


def _confirmed_rate(rate: Mapping[str, Any]) -> dict[str, Any]:
    """A version-5 detection rate in version 6's counts (``upgrade``)."""
    if "detected" not in rate:
        return dict(rate)
    out = {k: v for k, v in rate.items() if k != "detected"}
    out.update(named=rate["detected"], reported=0,
               wrong_rank=rate["detected"] - rate["right_rank"])
    return out


def parse_record(doc: Any, source: str = "<memory>") -> RunRecord:
    """Validate a loaded document; raises :class:`RecordError` naming what is wrong."""
    _need(isinstance(doc, dict), source, "not a JSON object")
    version = _version(doc, source)
    meta = doc.get("meta")
    _need(isinstance(meta, dict) and isinstance(meta.get("compare_config"), dict), source,
          "meta.compare_config missing")
    unknown = set(doc) - set(SECTIONS) - {"schema_version", "meta"}
    _need(not unknown, source, f"unknown top-level keys {sorted(unknown)}")
    for name in SECTIONS:
        _need(doc.get(name) is None or isinstance(doc[name], dict), source,
              f"section {name} must be an object")
    _check_runs(doc, source)
    _check_counts(doc, source)
    if version < SCHEMA_VERSION:
        doc = upgrade(doc, version)
    return RunRecord(SCHEMA_VERSION, _environment(meta, source), doc, source,
                     None if version == SCHEMA_VERSION else version)


def as_record(obj: RunRecord | Mapping[str, Any]) -> RunRecord:
    """A record as is, or a loaded document validated (for callers holding ``raw.json``'s dict)."""
    return obj if isinstance(obj, RunRecord) else parse_record(obj)


def load_record(path: str | os.PathLike) -> RunRecord:
    """Read and validate ``path``; the record's source is its machine directory's name."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read a run record ({exc}); {REGENERATE}") from None
    return parse_record(doc, source=path.parent.name or str(path))
