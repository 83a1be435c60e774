"""Rendering stored results: tables (tabulate, GitHub format), plots and the claims ledger.

Everything here is a pure function of the validated run record (``record.load_record``), so
``openclaw-bench report`` run twice writes identical bytes. Every table has a caption saying
exactly what ran, and a correctness column beside every timing column (nccl-tests' habit).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from openclaw_ref.core.jsonio import write_text_atomic
from openclaw_ref.reporting.record import RAW_NAME, RunRecord, load_record


def _fmt_mb(values: list[float]) -> str:
    return f"{max(values):.0f}" if values else "-"


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


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
# The comparison document


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def strategy_rows(raw: dict) -> list[dict]:
    """One row per (variant, world size): medians over repeats, correctness beside timing."""
    runs = raw["strategies"]["runs"]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    sizes = sorted({r["world_size"] for r in runs})
    local = {(r["world_size"], r["repeat"]): r["summary"]["median_step_ms"]
             for r in runs if r["sync"]["name"] == "local" and "error" not in r}
    rows = []
    for w in sizes:
        for v in variants:
            group = [r for r in runs if r["variant"] == v and r["world_size"] == w]
            if not group:
                continue
            ok = [r for r in group if "error" not in r]
            if not ok:
                stop = group[0].get("stopped_by")
                rows.append({"variant": v, "ranks": w, "error": group[0]["error"],
                             "stopped_by": stop})
                continue
            s = [r["summary"] for r in ok]
            sync = [x.get("sync", {}) for x in s]
            exposed = [r["summary"]["median_step_ms"] - local[(w, r["repeat"])]
                       for r in ok if (w, r["repeat"]) in local]
            elements = sum(x.get("elements", 0) or 0 for x in sync)
            overflowed = sum(x.get("overflow_elements", 0) or 0 for x in sync)
            rows.append({
                "variant": v, "ranks": w, "repeats": len(ok),
                "step_ms": _median([x["median_step_ms"] for x in s]),
                "exposed_sync_ms": _median(exposed) if v != "local (no sync)" else None,
                "skew_p50_ms": _median([r["skew_p50_ms"] for r in ok]),
                "skew_p99_ms": _median([r["skew_p99_ms"] for r in ok]),
                "step_cv": _median([x["step_ms_cv"] for x in s]),
                "peak_mib": max(max(x["peak_memory_mb"]) for x in s),
                "overflow_rate": (overflowed / elements) if elements else None,
                "skipped_steps": sum(x["skipped_steps"] for x in s),
                "checks_fired": sum(len(r["events"]) for r in ok),
                "checks_run": sum(x.get("checks_run", 0) or 0 for x in sync),
                "max_abs_diff": max(r["max_abs_diff_vs_reference"] for r in ok),
                "replicas_equal": all(x["replicas_equal"] for x in s),
                "costs": next((r["costs"] for r in ok if r.get("costs")), None),
                "final_loss": _median([x["final_loss"] for x in s]),
            })
    return rows


def _strategy_table(rows: list[dict]) -> str:
    table = []
    for r in rows:
        if "error" in r:
            stop = r.get("stopped_by")
            what = (f"stopped: {stop['kind']} at step {stop['step']}, ranks {stop['ranks']}"
                    if stop else f"error: {r['error'][:70]}")
            table.append([r["variant"], r["ranks"]] + ["-"] * 8 + [what] + ["-"] * 3)
            continue
        table.append([
            r["variant"], r["ranks"], _f(r["step_ms"]), _f(r["exposed_sync_ms"]),
            _f(r["skew_p50_ms"], 2), _f(r["skew_p99_ms"], 2), _f(r["step_cv"], 3),
            _f(r["peak_mib"], 0),
            "-" if r["overflow_rate"] is None else f"{100 * r['overflow_rate']:.4f}%",
            r["skipped_steps"], f"{r['checks_fired']} / {r['checks_run']}",
            f"{r['max_abs_diff']:.1e}", "yes" if r["replicas_equal"] else "NO",
            f"{r['final_loss']:.4f}",
        ])
    headers = ["strategy", "ranks", "step ms", "exposed sync ms", "skew p50 ms", "skew p99 ms",
               "step CV", "peak MiB", "overflow (elem)", "skipped", "fired / checks run",
               "max |Δ| vs 1 proc", "replicas equal", "final loss"]
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def _costs_table(rows: list[dict]) -> str | None:
    table = []
    for r in rows:
        c = r.get("costs")
        if c:
            table.append([r["variant"], r["ranks"], c.get("collectives"), c.get("wire_bytes"),
                          c.get("host_syncs")])
    if not table:
        return None
    return tabulate(table, headers=["strategy", "ranks", "collectives/step", "bytes/step",
                                    "host syncs/step"], tablefmt="github", disable_numparse=True)


def _generic_tables(section: dict) -> list[str]:
    """Sections from other modules carry ``tables``: caption, headers, rows."""
    out = []
    for t in section.get("tables", []):
        out.append(f"**{t['caption']}**\n\n"
                   + tabulate(t["rows"], headers=t["headers"], tablefmt="github",
                              disable_numparse=True))
    return out


def _env_block(raw: dict) -> str:
    env = raw["meta"]["environment"]
    cfg = raw["meta"]["compare_config"]
    lines = [f"- {k}: `{env.get(k)}`" for k in
             ("git_sha", "date", "torch", "cuda", "nccl", "backend", "cpu_model", "cpu_count",
              "gpu_count", "gpu_models", "python")]
    lines.append(f"- compare config: preset `{cfg['preset']}`, world sizes {cfg['world_sizes']}, "
                 f"{cfg['steps']} steps × {cfg['repeats']} repeats, global batch "
                 f"{cfg['global_batch']}, bucket cap {cfg['bucket_cap_mb']} MB, seed {cfg['seed']}")
    lines.append(f"- wall time of the comparison: {raw['meta'].get('wall_s')} s")
    return "\n".join(lines)


def comparison_markdown(rec: RunRecord) -> str:
    raw = rec.doc
    cfg = rec.config
    intro = ("Generated by `openclaw-bench compare` (re-render with `openclaw-bench report`); "
             f"raw data in `raw.json` (record schema {rec.schema_version}).")
    parts = ["# openclaw-sync comparison", "", intro, "", "## Environment", "", _env_block(raw),
             ""]
    if "strategies" in raw:
        rows = strategy_rows(raw)
        caption = (
            f"**Each row: the tiny-preset openclaw model trained for {cfg['steps']} steps "
            f"(global batch {cfg['global_batch']}, seed {cfg['seed']}, AdamW) with the named sync "
            f"strategy, repeated {cfg['repeats']}× with the strategy order rotated per repeat; "
            "medians over repeats. step ms = median over steps (after 2 warm-up steps) of the "
            "slowest rank; exposed sync = step ms − the no-sync (`local`) step ms of the same "
            "repeat; skew = per bucket, max − min of the ranks' bucket-ready times measured "
            "before the collective; max |Δ| = largest parameter difference from one process "
            "trained without sync on the same global batch.**")
        parts += ["## Strategies × world size", "", caption, "", _strategy_table(rows), ""]
        costs = _costs_table(rows)
        if costs:
            parts += ["**Exact per-step costs (from the bucket layout actually used).**", "",
                      costs, ""]
    for name, title in (("faults", "Fault × strategy outcomes"),
                        ("overflow", "FP16 overflow"),
                        ("precision", "Seed 004: precision × devices"),
                        ("raw_allreduce", "Raw allreduce of the same bytes"),
                        ("ablations", "Controls the seeds did not run"),
                        ("lightning", "Seed 004: a Lightning run"),
                        ("quantization", "Seed 004: int8 quantization"),
                        ("hook_cost", "What the hardened hook costs, and its verification "
                                      "at scale")):
        if name in raw:
            parts += [f"## {title}", ""] + [t + "\n" for t in _generic_tables(raw[name])]
    skipped = raw["meta"].get("sections_skipped", {})
    if skipped:
        parts += ["## Not run", ""] + [f"- {k}: {v}" for k, v in sorted(skipped.items())] + [""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# The claims ledger


def claims_markdown(rec: RunRecord, rendered_from: str) -> str:
    """The ledger of one machine directory: header naming where it was rendered from, verdict
    counts, one row per claim (with its seed source), then the seed documents."""
    from openclaw_ref.reporting.claims import MIN_REPEATS, SOURCES, VERDICTS, assess_all

    env = rec.environment
    found = assess_all(rec)
    counts = {v: sum(f.label == v for _, f in found) for v in VERDICTS}
    rows = [[c.id, c.text, c.source, f.ran, f.measured, f"**{f.verdict}**", f"`{f.command}`"]
            for c, f in found]
    schema = (f"record schema {rec.upgraded_from}, read as {rec.schema_version}: no field "
              "changed" if rec.upgraded_from else f"record schema {rec.schema_version}")
    where = (f"Rendered from `{rendered_from}/raw.json` ({schema}) by `openclaw-bench report`; "
             "each verdict is computed from that record by the rule of its claim in "
             "`openclaw_ref/reporting/claims.py`. Each machine directory keeps its own ledger.")
    vocabulary = (f"Vocabulary: {', '.join(VERDICTS)}. Timing is judged only at ranks ≤ cores "
                  f"(GPUs under NCCL), from ≥ {MIN_REPEATS} interleaved repeats with a seeded "
                  "bootstrap interval; an interval containing the threshold is *inside the "
                  "noise here*.")
    head = ["# Seed claims ledger", "", where, "",
            f"Measured on: {env.describe()}, git {env.git_sha}, {env.date}.", "",
            "Verdicts: " + ", ".join(f"{k}: {v}" for k, v in counts.items() if v), "",
            vocabulary, "", ""]
    table = tabulate(rows, headers=["id", "claim", "source", "what we ran", "what we measured",
                                    "verdict", "regenerate with"], tablefmt="github",
                     disable_numparse=True)
    sources = ["", "## Sources", ""] + [f"- **{k}**: {v}" for k, v in SOURCES.items()]
    return "\n".join(head) + table + "\n" + "\n".join(sources) + "\n"


def render_all(out_dir: Path) -> list[Path]:
    """Re-render every derived file of a results directory from its validated ``raw.json``;
    the top-level ``claims.md`` is the ledger of the directory rendered last, and says so."""
    from openclaw_ref.reporting.plots import render_plots

    rec = load_record(out_dir / RAW_NAME)
    ledger = claims_markdown(rec, f"{out_dir.parent.name}/{out_dir.name}")
    written = [write_text_atomic(out_dir / "comparison.md", comparison_markdown(rec)),
               write_text_atomic(out_dir / "claims.md", ledger),
               write_text_atomic(out_dir.parent / "claims.md", ledger)]
    written += render_plots(rec, out_dir)
    return written


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
             _fmt_cell(c["exposed_sync_ms"], 1), _fmt_cell(c["sync_ms"], 1), _fmt_cell(c["step_ms_cv"], 3),
             _fmt_cell(c["skew_p50_ms"]), _fmt_cell(c["skew_p99_ms"]), _fmt_cell(c["peak_memory_mb"], 0),
             _fmt_cell(c["overflow_rate"], 5), _fmt_cell(c["raw_allreduce_ms"], 1),
             _fmt_cell(c["raw_busbw_gbps"], 3), _fmt_cell(c["sync_over_raw"]),
             _fmt_cell(c["collectives_per_step"]), _fmt_cell(c["wire_bytes_per_step"]),
             _fmt_cell(c["host_syncs_per_step"]), _checks(c), _fmt_cell(c["replicas_equal"]), c["events"]]
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
        out += ["\n**Seed 004's matrix (claim L3)** — s/iter = median step; memory = peak per "
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
    """One row per ``conform.CheckResult``: PASS/FAIL and the detail."""
    rows = [{"check": r.check, "strategy": r.strategy, "result": "PASS" if r.passed else "FAIL",
             "detail": r.detail[:110]} for r in results]
    return tabulate(rows, headers="keys", tablefmt="github")


def fault_matrix_table(outcomes: Sequence) -> str:
    """Faults down, strategies across; each cell the outcome and its attribution."""
    strategies = list(dict.fromkeys(o.strategy for o in outcomes))
    faults = list(dict.fromkeys(o.fault for o in outcomes))
    cell = {(o.fault, o.strategy): o.summary() for o in outcomes}
    rows = [[f] + [cell.get((f, s), "") for s in strategies] for f in faults]
    return tabulate(rows, headers=["fault"] + strategies, tablefmt="github")


def p2_table(rows: list[list]) -> str:
    """``p2bench.summarize`` rows: one per barrier arm."""
    return tabulate(rows, headers=["barrier", "step ms", "ready-std ms", "p90 ready-std ms",
                                   "skew ms", "sync ms", "barriers", "steps"], tablefmt="github")
