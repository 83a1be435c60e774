"""The comparison document (``comparison.md``) of one results directory, a pure function of
its validated record: the environment, the strategies × world size table with its exact
per-step costs, then every other section's captioned tables (``section_tables``).
"""

from __future__ import annotations

import statistics

from tabulate import tabulate

from openclaw_ref.core.metrics import RatioInterval, bootstrap_ratio
from openclaw_ref.reporting.record import RunRecord
from openclaw_ref.reporting.section_tables import SECTION_TABLES
from openclaw_ref.reporting.table import ratio_cell
from openclaw_ref.reporting.timeline import timeline_caption


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


NO_PEER = "n/a (1 rank: no peer)"
QUICK_TITLE = "QUICK RUN: not results"
QUICK_BANNER = (f"> **{QUICK_TITLE}.** Made by `openclaw-bench compare --quick`: a "
                "representative subset of every section at small settings (few steps, 2 "
                "repeats, 1–2 ranks), to show what the full comparison produces. Its figures "
                "and verdicts are not measurements to quote or publish; the published "
                "comparison is `tox -e compare` (`results/<machine>/`).")


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _vs_ddp(ok: list[dict], ddp: dict[int, float]) -> RatioInterval | None:
    """This row's step time ÷ ddp's, paired by repeat (the repeats interleave the variants)."""
    pairs = [(r["summary"]["median_step_ms"], ddp[r["repeat"]]) for r in ok
             if r["repeat"] in ddp]
    if len(pairs) < 2:
        return None
    return bootstrap_ratio([a for a, _ in pairs], [b for _, b in pairs])


def strategy_rows(raw: dict) -> list[dict]:
    """One row per (variant, world size): medians over repeats with their range, the paired
    ratio to ddp with its bootstrap interval, correctness beside timing."""
    runs = raw["strategies"]["runs"]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    sizes = sorted({r["world_size"] for r in runs})
    local = {(r["world_size"], r["repeat"]): r["summary"]["median_step_ms"]
             for r in runs if r["sync"]["name"] == "local" and "error" not in r}
    rows = []
    for w in sizes:
        ddp = {r["repeat"]: r["summary"]["median_step_ms"] for r in runs
               if r["variant"] == "ddp" and r["world_size"] == w and "error" not in r}
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
            steps = [x["median_step_ms"] for x in s]
            rows.append({
                "variant": v, "ranks": w, "repeats": len(ok),
                "step_ms": _median(steps), "step_ms_range": (min(steps), max(steps)),
                "vs_ddp": None if v == "ddp" else _vs_ddp(ok, ddp),
                "exposed_sync_ms": (_median(exposed) if w > 1 and v != "local (no sync)"
                                    else None),
                "skew_p50_ms": _median([r["skew_p50_ms"] for r in ok]),
                "skew_p99_ms": _median([r["skew_p99_ms"] for r in ok]),
                "step_cv": _median([x["step_ms_cv"] for x in s]),
                "peak_mib": max(max(x["peak_memory_mb"]) for x in s),
                "peak_mib_runs": [max(x["peak_memory_mb"]) for x in s],
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


def memory_is_noise(rows: list[dict]) -> tuple[float, float] | None:
    """(fp32 gradient MiB, run-to-run spread of the resident peak MiB at one world size) when
    the gradients are smaller than that spread — the peak then cannot show a sync's memory —
    else None."""
    grads = max(((r.get("costs") or {}).get("wire_bytes", 0) for r in rows if "error" not in r
                 and r["variant"] == "ddp"), default=0) / 2**20
    spread = max((max(runs) - min(runs) for w in {r["ranks"] for r in rows}
                  if len(runs := [p for r in rows if r["ranks"] == w and "error" not in r
                                  for p in r["peak_mib_runs"]]) > 1), default=0.0)
    return (grads, spread) if 0 < grads < spread else None


def _ranks_cell(w: int, capacity: int) -> str:
    return f"{w} (oversubscribed)" if w > capacity else str(w)


def _vs_ddp_cell(r: dict) -> str:
    iv: RatioInterval | None = r["vs_ddp"]
    if r["variant"] == "ddp":
        return "1"
    if iv is None:
        return "-"
    return ratio_cell(iv.point, iv.low, iv.high)


def _strategy_table(rows: list[dict], capacity: int, show_memory: bool) -> str:
    table = []
    width = 12 if show_memory else 11
    for r in rows:
        ranks = _ranks_cell(r["ranks"], capacity)
        if "error" in r:
            stop = r.get("stopped_by")
            what = (f"stopped: {stop['kind']} at step {stop['step']}, ranks {stop['ranks']}"
                    if stop else f"error: {r['error'][:70]}")
            table.append([r["variant"], ranks] + ["-"] * (width - 3) + [what] + ["-"] * 3)
            continue
        lo, hi = r["step_ms_range"]
        exposed = NO_PEER if r["ranks"] == 1 else _f(r["exposed_sync_ms"])
        table.append([
            r["variant"], ranks, f"{_f(r['step_ms'])} [{_f(lo)}, {_f(hi)}]", _vs_ddp_cell(r),
            exposed, _f(r["skew_p50_ms"], 2), _f(r["skew_p99_ms"], 2), _f(r["step_cv"], 3),
            *([f"{r['peak_mib']:.0f}"] if show_memory else []),
            "-" if r["overflow_rate"] is None else f"{100 * r['overflow_rate']:.4f}%",
            r["skipped_steps"], f"{r['checks_fired']} / {r['checks_run']}",
            f"{r['max_abs_diff']:.1e}", "yes" if r["replicas_equal"] else "NO",
            f"{r['final_loss']:.4f}",
        ])
    headers = ["strategy", "ranks", "step ms [range over repeats]", "÷ ddp [95 %]",
               "exposed sync ms", "skew p50 ms", "skew p99 ms", "step CV",
               *(["peak MiB"] if show_memory else []), "overflow (elem)", "skipped",
               "fired / checks run", "max |Δ| vs 1 proc", "replicas equal", "final loss"]
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def _strategy_caption(cfg: dict, rows: list[dict], capacity: int, device: str,
                      memory_noise: tuple[float, float] | None) -> str:
    over = sorted({r["ranks"] for r in rows if r["ranks"] > capacity})
    repeats = cfg["repeats"]
    text = (
        f"Each row: the tiny-preset openclaw model trained for {cfg['steps']} steps "
        f"(global batch {cfg['global_batch']}, seed {cfg['seed']}, AdamW) with the named sync "
        f"strategy, repeated {repeats}× with the strategy order rotated per repeat. step ms = "
        "median over repeats of each run's median step (after 2 warm-up steps) of the slowest "
        "rank, with the range over repeats; ÷ ddp = the median step ÷ ddp's, paired by repeat, "
        f"with a 95 % paired bootstrap interval from only {repeats} repeats (coarse: it can take "
        "few distinct values); where it contains 1 the difference is inside the noise here. "
        "Separate runs move by ~±12 % on this host, so the interleaved hook-cost table below, "
        "not this one, is the source of the hook's cost. exposed sync = step ms − the no-sync "
        "(`local`) step ms of the same repeat (n/a at 1 rank: there is no peer to wait for); "
        "skew = per bucket, max − min of the ranks' bucket-ready times measured before the "
        "collective; max |Δ| = largest parameter difference from one process trained without "
        "sync on the same global batch.")
    if over:
        text += (f" Oversubscribed: {over} ranks on a host with {capacity} {device} — the "
                 "ranks time-share, so those step times measure the host, not the sync.")
    if memory_noise is not None:
        grads, spread = memory_noise
        text += (f" Peak memory not shown: the fp32 gradients ({grads:.2f} MiB) are far below "
                 f"the run-to-run spread of the resident peak ({spread:.0f} MiB).")
    return f"**{text}**"


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


def _run_of(run: dict) -> str:
    """One merged-in run's provenance in words: commit, date, versions, the section's time."""
    env = run.get("environment", {})
    return (f"git `{env.get('git_sha')}`, {env.get('date')}, torch `{env.get('torch')}`, "
            f"python `{env.get('python')}`, {run.get('seconds')} s")


def separate_runs(rec: RunRecord) -> str:
    """The sentence naming every section measured by a later, partial compare merged into the
    record ("" for a record of one run): where the sections of one document come from."""
    runs = rec.section_runs
    if not runs:
        return ""
    return ("Sections measured by a later `openclaw-bench compare --sections …` run, merged into "
            "this record with the same settings and hardware (each run's environment is in "
            "`raw.json`, `meta.section_runs`): "
            + "; ".join(f"{name} ({_run_of(run)})" for name, run in runs.items()) + ".")


def _section_note(rec: RunRecord, name: str) -> list[str]:
    """Under a section's heading: that it was measured apart from the Environment's run."""
    run = rec.section_runs.get(name)
    if run is None:
        return []
    return [f"*Measured by a later run than the one under Environment: {_run_of(run)}.*", ""]


def _env_block(raw: dict) -> str:
    env = raw["meta"]["environment"]
    cfg = raw["meta"]["compare_config"]
    lines = [f"- {k}: `{env.get(k)}`" for k in
             ("git_sha", "date", "torch", "cuda", "nccl", "backend", "cpu_model", "cpu_count",
              "gpu_count", "gpu_models", "python")]
    lines.append(f"- compare config: preset `{cfg['preset']}`, world sizes {cfg['world_sizes']}, "
                 f"{cfg['steps']} steps × {cfg['repeats']} repeats, global batch "
                 f"{cfg['global_batch']}, bucket cap {cfg['bucket_cap_mb']} MB, seed {cfg['seed']}"
                 + (" (`--quick`: each section's quick subset)" if cfg.get("quick") else ""))
    lines.append(f"- wall time of the comparison: {raw['meta'].get('wall_s')} s")
    return "\n".join(lines)


def _env_section(rec: RunRecord) -> list[str]:
    apart = separate_runs(rec)
    return [_env_block(rec.doc), *(["", apart] if apart else []), ""]


def comparison_markdown(rec: RunRecord) -> str:
    raw = rec.doc
    cfg = rec.config
    intro = ("Generated by `openclaw-bench compare` (re-render with `openclaw-bench report`); "
             f"raw data in `raw.json` (record schema {rec.schema_version}).")
    parts = ["# openclaw-sync comparison", "", *([QUICK_BANNER, ""] if rec.quick else []),
             intro, "", "## Environment", "", *_env_section(rec)]
    if "strategies" in raw:
        rows = strategy_rows(raw)
        capacity = rec.environment.capacity
        noise = memory_is_noise(rows)
        device = "GPUs" if rec.environment.backend == "nccl" else "cores"
        caption = _strategy_caption(cfg, rows, capacity, device, noise)
        parts += ["## Strategies × world size", "", *_section_note(rec, "strategies"), caption,
                  "",
                  _strategy_table(rows, capacity, show_memory=noise is None), ""]
        costs = _costs_table(rows)
        if costs:
            parts += ["**Exact per-step costs (from the bucket layout actually used).**", "",
                      costs, ""]
        parts += [timeline_caption(rec), ""]
    for name, (title, tables) in SECTION_TABLES.items():
        if name in raw:
            parts += [f"## {title}", "", *_section_note(rec, name)] + [
                t.markdown() + "\n" for t in tables(raw[name], cfg)]
    skipped = raw["meta"].get("sections_skipped", {})
    if skipped:
        parts += ["## Not run", ""] + [f"- {k}: {v}" for k, v in sorted(skipped.items())] + [""]
    return "\n".join(parts)
