"""Rendering stored results: ``render_all`` (a results directory's comparison document,
claims ledger and plots), the ledger itself, and the tables of the other producers (train,
bench, conformance, fault matrix, P2) — they make records, this package renders them.

Everything here is a pure function of the validated run record (``record.load_record``), so
``openclaw-bench report`` run twice writes identical bytes. Every table has a caption saying
exactly what ran, and a correctness column beside every timing column (nccl-tests' habit);
the comparison document's tables live in ``comparison`` and ``section_tables``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from openclaw_ref.core.jsonio import write_text_atomic
from openclaw_ref.reporting.record import RAW_NAME, RunRecord, load_record


def _fmt_mb(values: list[float]) -> str:
    return f"{max(values):.0f}" if values else "-"


def train_summary_table(record: dict) -> str:
    """The summary ``openclaw-bench train`` prints: one row, correctness beside speed."""
    cfg, s, env = record["config"], record["summary"], record["environment"]
    wire = cfg["sync"]["wire"]
    row = {
        "sync": cfg["sync"]["name"] + ("" if wire in ("fp32", "native") else f"/{wire}"),
        "ranks": env["world_size"],
        "backend": env["backend"],
        "steps": len(record["steps"]),
        "loss first→last": f"{s['first_loss']:.3f}→{s['final_loss']:.3f}",
        "val loss": f"{s['final_val_loss']:.3f}",
        "median step ms": f"{s['median_step_ms']:.1f}",
        "step CV": f"{s['step_ms_cv']:.3f}",
        "replicas equal": "yes" if s["replicas_equal"] else "NO",
        "skipped": s["skipped_steps"],
        "events": len(record["events"]),
        "peak MiB/rank": _fmt_mb(s["peak_memory_mb"]),
    }
    return tabulate([row], headers="keys", tablefmt="github")


# ---------------------------------------------------------------------------------------------
# The claims ledger


def claims_markdown(rec: RunRecord, rendered_from: str) -> str:
    """The ledger of one machine directory: header naming where it was rendered from, verdict
    counts, one row per claim (with its source), then the source texts."""
    from openclaw_ref.reporting.claims import MIN_REPEATS, SOURCES, Verdict, assess_all
    from openclaw_ref.reporting.comparison import QUICK_BANNER, separate_runs

    env = rec.environment
    found = assess_all(rec)
    counts = {v: sum(f.label == v for _, f in found) for v in Verdict}
    rows = [[c.id, c.text, c.source, f.ran, f.measured, f"**{f.verdict}**",
             f"`{f.command}`" if f.command else "nothing to regenerate"] for c, f in found]
    schema = (f"record schema {rec.upgraded_from}, read as {rec.schema_version}: no figure "
              "changed" if rec.upgraded_from else f"record schema {rec.schema_version}")
    where = (f"Rendered from `{rendered_from}/raw.json` ({schema}) by `openclaw-bench report`; "
             "each verdict is computed from that record by the rule of its claim in "
             "`openclaw_ref/reporting/claims/`. Each machine directory keeps its own ledger.")
    vocabulary = (f"Vocabulary: {', '.join(Verdict)}. Timing is judged only at ranks ≤ cores "
                  f"(GPUs under NCCL), from ≥ {MIN_REPEATS} interleaved repeats with a seeded "
                  "bootstrap interval; an interval containing the threshold is *inside the "
                  f"noise here*. From only {rec.config.get('repeats', MIN_REPEATS)} repeats an "
                  "interval takes few distinct values, so a verdict near its threshold can move "
                  "with one repeat (rerun with a larger `--repeats`). \"regenerate with\" names "
                  "the compare run that writes the figures a verdict reads; \"nothing to "
                  "regenerate\" where no run here can move it.")
    head = ["# Claims ledger of the source texts", "", *([QUICK_BANNER, ""] if rec.quick else []),
            where, "",
            f"Measured on: {env.describe()}, git {env.git_sha}, {env.date}.", "",
            *([separate_runs(rec), ""] if rec.section_runs else []),
            "Verdicts: " + ", ".join(f"{k}: {v}" for k, v in counts.items() if v), "",
            vocabulary, "", ""]
    table = tabulate(rows, headers=["id", "claim", "source", "what we ran", "what we measured",
                                    "verdict", "regenerate with"], tablefmt="github",
                     disable_numparse=True)
    sources = ["", "## Sources", ""] + [f"- **{k}**: {v}" for k, v in SOURCES.items()]
    return "\n".join(head) + table + "\n" + "\n".join(sources) + "\n"


def render_all(out_dir: Path) -> list[Path]:
    """Re-render every derived file of a results directory from its validated ``raw.json``;
    the top-level ``claims.md`` and ``README.md`` (what harden() buys, ``summary``) are those of
    the directory rendered last, and say so. Rendering the reference machine's record also
    rewrites the project README's cost line (``speed.render_readme``)."""
    from openclaw_ref.reporting.comparison import comparison_markdown
    from openclaw_ref.reporting.plots import render_plots
    from openclaw_ref.reporting.speed import render_readme
    from openclaw_ref.reporting.summary import results_readme

    rec = load_record(out_dir / RAW_NAME)
    ledger = claims_markdown(rec, f"{out_dir.parent.name}/{out_dir.name}")
    written = [write_text_atomic(out_dir / "comparison.md", comparison_markdown(rec)),
               write_text_atomic(out_dir / "claims.md", ledger),
               write_text_atomic(out_dir.parent / "claims.md", ledger),
               write_text_atomic(out_dir.parent / "README.md", results_readme(rec, out_dir.name))]
    written += render_plots(rec, out_dir)
    readme = render_readme(rec, out_dir.resolve().parent.parent / "README.md")
    return written + ([readme] if readme else [])


# ---------------------------------------------------------------------------------------------
# Tables of the other producers (bench, conformance, fault matrix, P2): they make records,
# this module renders them.


def _fmt_cell(x: object, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _checks(case: dict) -> str:
    run, passed = case.get("checks_run"), case.get("checks_passed")
    return "—" if not run else f"{passed}/{run}"


def bench_matrix_markdown(result: dict) -> str:
    """Markdown tables of a ``bench.matrix.run_matrix`` result, each with its caption."""
    s = result["settings"]
    env = result["environment"]
    head = (f"preset {s['preset']}, global batch {s['global_batch']}, "
            f"{s['threads'] or 'cores ÷ ranks'} torch thread(s) per rank, {s['rounds']} × "
            f"{s['steps']} steps per strategy alternating with the local floor (2 warm-up steps "
            f"per run excluded), raw allreduce × {s['raw_iters']}; torch {env['torch']}, "
            f"{env['cpu_count']} CPUs ({env['cpu_model']}), {env['gpu_count']} GPUs, "
            f"git {env['git_sha'][:12]}")
    rows = [[c["strategy"], c["world_size"], c["backend"], _fmt_cell(c["median_step_ms"], 1),
             _fmt_cell(c["exposed_sync_ms"], 1), _fmt_cell(c["sync_ms"], 1),
             _fmt_cell(c["step_ms_cv"], 3), _fmt_cell(c["skew_p50_ms"]),
             _fmt_cell(c["skew_p99_ms"]), _fmt_cell(c["peak_memory_mb"], 0),
             _fmt_cell(c["overflow_rate"], 5), _fmt_cell(c["raw_allreduce_ms"], 1),
             _fmt_cell(c["raw_busbw_gbps"], 3), _fmt_cell(c["sync_over_raw"]),
             _fmt_cell(c["collectives_per_step"]), _fmt_cell(c["wire_bytes_per_step"]),
             _fmt_cell(c["host_syncs_per_step"]), _checks(c), _fmt_cell(c["replicas_equal"]),
             c["events"]]
            for c in result["cases"]]
    out = [f"**Sync strategies × world size** — {head}.\n",
           tabulate(rows, headers=["strategy", "ranks", "backend", "step ms", "exposed sync ms",
                                   "sync ms", "step CV", "skew p50", "skew p99", "peak MB/rank",
                                   "overflow", "raw AR ms", "busbw GB/s", "sync/raw",
                                   "coll/step", "wire B/step", "host syncs", "checks passed",
                                   "replicas equal", "events"], tablefmt="github")]
    if result["seed004"]:
        rows = [[c["precision"], c["amp_dtype"] or "—", c["world_size"], c["strategy"],
                 c["backend"], _fmt_cell(c["s_per_iter"], 3), _fmt_cell(c["peak_memory_mb"], 0)]
                for c in result["seed004"]]
        out += ["\n**Text 004's matrix (claim L3)** — s/iter = median step; memory = peak per "
                "rank (max RSS on CPU).\n",
                tabulate(rows, headers=["precision", "autocast", "ranks", "strategy", "backend",
                                        "s/iter", "peak MB/rank"], tablefmt="github")]
    if result["targets"]:
        rows = [[t["target"], t["world_size"], _fmt_cell(t["value"], 3), f"≤ {t['threshold']}",
                 {True: "met", False: "NOT met", None: "n/a"}[t["met"]], t["note"]]
                for t in result["targets"]]
        out += ["\n**Targets** (reported, never asserted).\n",
                tabulate(rows, headers=["target", "ranks", "value", "threshold", "status",
                                        "note"], tablefmt="github")]
    if result["skipped"] or result["failed"]:
        out.append("\nSkipped: " + "; ".join(f"{x['case']} ({x['reason']})"
                                             for x in result["skipped"]))
        out.append("\nFailed: " + "; ".join(f"{x['case']} ({x['error']})"
                                            for x in result["failed"]))
    return "\n".join(out) + "\n"


def conformance_results_table(results: Sequence) -> str:
    """One row per ``conform.CheckResult``: PASS/FAIL (a property of the model: MODEL) and the
    detail."""
    rows = [{"check": r.check, "strategy": r.strategy, "result": _verdict(r),
             "detail": r.detail[:160]} for r in results]
    return tabulate(rows, headers="keys", tablefmt="github")


def _verdict(result) -> str:
    if getattr(result, "role", "check") == "property":
        return "MODEL"
    return "PASS" if result.passed else "FAIL"


def fault_matrix_table(outcomes: Sequence, columns: Mapping[str, Any] | None = None) -> str:
    """Faults down, strategies across; each cell the outcome and its attribution. With
    ``columns`` (``fault_matrix.column_settings``), a column run with settings other than its
    defaults is marked, and a note under the table says how each differs."""
    from openclaw_ref.reporting.section_tables import column_header, settings_sentence

    columns = columns or {}
    strategies = list(dict.fromkeys(o.strategy for o in outcomes))
    faults = list(dict.fromkeys(o.fault for o in outcomes))
    cell = {(o.fault, o.strategy): o.summary() for o in outcomes}
    rows = [[f] + [cell.get((f, s), "") for s in strategies] for f in faults]
    table = tabulate(rows, headers=["fault"] + [column_header(s, columns) for s in strategies],
                     tablefmt="github")
    seen = {s: columns[s] for s in strategies if s in columns}
    return table + (f"\n\n{settings_sentence(seen, {})}" if seen else "")


def p2_table(rows: list[list]) -> str:
    """``p2bench.summarize`` rows: one per barrier arm."""
    return tabulate(rows, headers=["barrier", "step ms", "ready-std ms", "p90 ready-std ms",
                                   "skew ms", "sync ms", "barriers", "steps"], tablefmt="github")
