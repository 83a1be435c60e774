"""``results/README.md``: what ``harden()`` buys, in one table a reader takes in — per fault class,
what stock DDP (or stock FSDP2) did, what ``harden()`` did, and what it costs — with a link to
the long table each row condenses. A pure function of the record, like every rendered file:
every figure and outcome is read from the sections the record holds (a section it lacks gives
no row), and no sentence states a number of its own.

Where each row comes from: the fault matrix (stock ``ddp`` against ``hardened-defaults``:
``harden(model)`` as users call it), the published DDP silent errors and FSDP2 mistakes, the
silent-data-corruption faults, the FSDP2 × tensor-parallel corpus and the healthy jobs. The
costs: the step guard's per-step ratio to stock DDP (``hook_cost``), the canary's probe step
spread over its recommended K (the same arithmetic as ``hook_cost_tables``), the FSDP2 guard's
ratio to stock FSDP2 (``fsdp_cost``); none yet for the TP meshes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from openclaw_ref.reporting.corpus_tables import COLUMN_TITLES
from openclaw_ref.reporting.fsdp_tables import FSDP_COLUMN_TITLES
from openclaw_ref.reporting.hook_cost_tables import amortized
from openclaw_ref.reporting.record import RunRecord
from openclaw_ref.reporting.section_tables import SECTION_TABLES
from openclaw_ref.reporting.table import Figures, Table, ratio_cell
from openclaw_ref.reporting.tp_tables import TP_COLUMN_TITLES

STOCK, HARDENED = "ddp", "hardened-defaults"  # the fault matrix's columns this table reads
NOT_RUN = "—"
NOT_MEASURED = "not measured on these meshes"


def _tally(outcomes: Iterable[str]) -> str:
    """Outcomes counted, most frequent first: ``silent-corruption ×9, crash ×1``."""
    return ", ".join(f"{o} ×{n}" for o, n in Counter(outcomes).most_common())


def _caught(cases: list[Figures]) -> str:
    """``caught 9 of 10 (…the others' outcomes)`` for one column of a corpus."""
    named = sum(c["outcome"] == "detected" for c in cases)
    rest = _tally(c["outcome"] for c in cases if c["outcome"] != "detected")
    return f"caught {named} of {len(cases)}" + (f" ({rest})" if rest else "")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading (as ``tests/test_docs.py`` computes it)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _link(machine: str, section: str) -> str:
    title = SECTION_TABLES[section][0]
    return f"[{title}]({machine}/comparison.md#{_anchor(title)})"


def step_cost(doc: Figures) -> str:
    """The step guard's ratio to stock DDP per step, from the first hook-cost job."""
    jobs = (doc.get("hook_cost") or {}).get("jobs") or {}
    for model, job in jobs.items():
        s = job["summary"].get("hardened")
        if s:
            return f"{ratio_cell(s['ratio'], s['ratio_low'], s['ratio_high'])} × a step ({model})"
    return NOT_RUN


def canary_cost(doc: Figures) -> str:
    """The canary's probe step spread over its recommended K, from the first job's pair."""
    for model, job in ((doc.get("hook_cost") or {}).get("jobs") or {}).items():
        for p in job.get("pairs", []):
            if "probe_every" in p:
                k, every = p["amortize_over"], p["probe_every"]
                cell = ratio_cell(*(amortized(p[f], every, k)
                                    for f in ("ratio", "ratio_low", "ratio_high")))
                return f"{cell} × a step at K = {k}, over `harden()` without it ({model})"
    return NOT_RUN


def fsdp_cost(doc: Figures) -> str:
    """The first FSDP2 cost job's ratio (the 1-D mesh at 2 ranks)."""
    for job in ((doc.get("fsdp_cost") or {}).get("jobs") or {}).values():
        s = job["summary"].get("hardened-fsdp")
        if s:
            return (f"{ratio_cell(s['ratio'], s['ratio_low'], s['ratio_high'])} × a stock "
                    f"FSDP2 step ({job['config']['model']})")
    return NOT_RUN


def fault_rows(doc: Figures, machine: str) -> list[list[str]]:
    """One row per fault of the matrix: stock DDP's cell and ``harden(model)``'s."""
    sec = doc.get("faults")
    if not sec:
        return []
    cell = {(c["fault"], c["strategy"]): c["cell"] for c in sec["cases"]}
    cost, where = step_cost(doc), _link(machine, "faults")
    faults = [f for f in dict.fromkeys(c["fault"] for c in sec["cases"]) if f != "none"]
    return [[f"fault matrix: `{f}` on one rank", cell.get((f, STOCK), NOT_RUN),
             cell.get((f, HARDENED), NOT_RUN), cost, where] for f in faults]


def corpus_rows(doc: Figures, machine: str) -> list[list[str]]:
    sec = doc.get("corpus")
    if not sec:
        return []
    rows = []
    for model in dict.fromkeys(c["model"] for c in sec["cases"]):
        mine = [c for c in sec["cases"] if c["model"] == model]
        rows.append([f"published DDP silent errors, {model}"]
                    + [f"{COLUMN_TITLES[col]}: "
                       + _caught([c for c in mine if c["column"] == col])
                       for col in ("ddp", "hardened")]
                    + [step_cost(doc), _link(machine, "corpus")])
    return rows


def sdc_rows(doc: Figures, machine: str) -> list[list[str]]:
    sec = doc.get("sdc")
    if not sec:
        return []
    by_column: dict[str, list[Figures]] = {}
    for c in sec["corpus"]:
        by_column.setdefault(c["column"], []).append(c)
    stock = [col for col in by_column if not col.startswith("harden")]
    guarded = [col for col in by_column if col.startswith("harden")]
    k = sec["settings"]["canary_every"]
    return [[f"a rank whose hardware computes wrong (silent data corruption; the canary "
             f"probing every {k} steps in these runs)",
             "; ".join(f"{col}: {_caught(by_column[col])}" for col in stock),
             "; ".join(f"{col}: {_caught(by_column[col])}" for col in guarded),
             canary_cost(doc), _link(machine, "sdc")]]


def fsdp_rows(doc: Figures, machine: str) -> list[list[str]]:
    sec = doc.get("fsdp_corpus")
    if not sec:
        return []
    rows = []
    for mesh, world in dict.fromkeys((c["mesh"], c["world_size"]) for c in sec["cases"]):
        here = [c for c in sec["cases"] if (c["mesh"], c["world_size"]) == (mesh, world)
                and c["pattern"] != "none"]
        rows.append([f"published FSDP2 mistakes, {mesh} on {world} ranks"]
                    + [f"{FSDP_COLUMN_TITLES.get(col, col)}: "
                       + _caught([c for c in here if c["column"] == col])
                       for col in ("stock", "hardened")]
                    + [fsdp_cost(doc), _link(machine, "fsdp_corpus")])
    return rows


def _quiet(cases: list[Figures]) -> str:
    """``quiet 5 of 6 (…the others' outcomes)`` for the healthy cases of one column: no error,
    no warning."""
    ok = [c for c in cases if c["outcome"] == "no-effect" and not c["warned_ranks"]]
    rest = _tally("warned" if c["outcome"] == "no-effect" else c["outcome"]
                  for c in cases if c not in ok)
    return f"quiet {len(ok)} of {len(cases)}" + (f" ({rest})" if rest else "")


def tp_rows(doc: Figures, machine: str) -> list[list[str]]:
    """One row for the FSDP2 × TP corpus, all meshes: the mistakes caught, the healthy set-ups
    left quiet, per column."""
    sec = doc.get("tp_corpus")
    if not sec:
        return []
    healthy = {(p["name"], p["mesh"]) for p in sec["cases_run"] if p["healthy"]}
    meshes = ", ".join(dict.fromkeys(f"{c['mesh']} on {c['world_size']} ranks"
                                     for c in sec["cases"]))

    def cell(col: str) -> str:
        mine = [c for c in sec["cases"] if c["column"] == col]
        bugs = [c for c in mine if (c["case"], c["mesh"]) not in healthy]
        good = [c for c in mine if (c["case"], c["mesh"]) in healthy]
        return (f"{TP_COLUMN_TITLES.get(col, col)}: mistakes {_caught(bugs)}; healthy "
                f"{_quiet(good)}")

    return [[f"FSDP2 × tensor parallel: published TP/SP mistakes and healthy set-ups, {meshes}",
             cell("stock"), cell("hardened"), NOT_MEASURED, _link(machine, "tp_corpus")]]


def healthy_rows(doc: Figures, machine: str) -> list[list[str]]:
    sec = doc.get("false_alarms")
    if not sec:
        return []
    rows = []
    for w in sorted({r["world_size"] for r in sec["rows"]}):
        mine = [r for r in sec["rows"] if r["world_size"] == w and "outcome" in r]
        rows.append([f"healthy jobs and named faults (false-alarm corpus), {w} ranks"]
                    + [f"{arm}: {_tally(r['outcome'] for r in mine if r['arm'] == arm)}"
                       for arm in ("stock DDP", "hardened")]
                    + [step_cost(doc), _link(machine, "false_alarms")])
    return rows


def summary_table(rec: RunRecord, machine: str) -> Table | None:
    doc = rec.doc
    rows = (fault_rows(doc, machine) + corpus_rows(doc, machine) + sdc_rows(doc, machine)
            + fsdp_rows(doc, machine) + tp_rows(doc, machine) + healthy_rows(doc, machine))
    if not rows:
        return None
    return Table(
        "Per fault class: what stock DDP (FSDP2 rows: stock FSDP2) did, what harden() did at "
        "its defaults (where a row names its columns, as the long table does), and what "
        "harden() costs — each cell read from the long table linked in its row. Outcomes: "
        "detected (the error raised, its step and ranks) / silent-corruption / crash / "
        "hang-timeout / no-effect; exact: bitwise equal to the reference. Cost: the median "
        "of per-step ratios with a 95 % bootstrap interval, arms interleaved in one job.",
        ["fault", "stock", "harden()", "what harden() costs", "long table"], rows)


def results_readme(rec: RunRecord, machine: str) -> str:
    """The whole ``results/README.md`` for the record of ``results/<machine>/``."""
    from openclaw_ref.reporting.comparison import QUICK_BANNER

    table = summary_table(rec, machine)
    head = ["# What harden() buys: the published results in one table", "",
            *([QUICK_BANNER, ""] if rec.quick else []),
            f"Rendered from `{machine}/raw.json` by `openclaw-bench report` (the machine "
            "directory rendered last, as `claims.md`); every figure is that record's. The "
            f"long tables: [`{machine}/comparison.md`]({machine}/comparison.md); the claims of "
            "the source texts, each with its verdict: [`claims.md`](claims.md); how to read "
            "them: [docs/results.md](../docs/results.md).", "",
            f"Measured on: {rec.environment.describe()}; each section's own commit and date "
            "are in `comparison.md`.", ""]
    body = [table.markdown()] if table else ["No fault section in this record."]
    return "\n".join(head + body) + "\n"
