"""The captioned tables of every comparison section but ``strategies``, built from the figures
a section stored in the record (``raw.json`` holds no caption and no formatted cell).

One function per section, ``(section figures, compare config) -> list[Table]``; the caption
of each table says exactly what ran, from the record alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openclaw_ref.reporting.corpus_tables import corpus_tables
from openclaw_ref.reporting.false_alarm_tables import false_alarm_tables
from openclaw_ref.reporting.fsdp_tables import fsdp_corpus_tables, fsdp_cost_tables
from openclaw_ref.reporting.hook_cost_tables import hook_cost_tables
from openclaw_ref.reporting.sdc_tables import sdc_tables
from openclaw_ref.reporting.table import Figures, Table, fixed, yes
from openclaw_ref.reporting.tp_tables import tp_corpus_tables


def _hook_columns(powersgd: Figures | None) -> str:
    """The caption's sentence on the columns of PyTorch's own hooks (records that have them)."""
    if powersgd is None:
        return ""
    return (" ddp: no hook; ddp-allreduce / ddp-fp16 / ddp-bf16 / ddp-powersgd: stock DDP with "
            "PyTorch's allreduce_hook / fp16_compress_hook / bf16_compress_hook / powerSGD_hook "
            f"(rank {powersgd['rank']}, error feedback, compression from step "
            f"{powersgd['start_iter']}, orthogonalization epsilon {powersgd['epsilon']:g}, "
            "buckets one after another; judged against its own fault-free run).")


NON_DEFAULT = "†"  # marks a fault-matrix column run with settings other than its defaults


def non_default_settings(column: Figures) -> dict[str, tuple[Any, Any]]:
    """A fault-matrix column's settings that differ from its strategy's defaults (harden()'s
    for the hardened columns): name → (as run, default)."""
    run, defaults = column["sync"], column["defaults"]
    return {k: (v, defaults.get(k)) for k, v in run.items() if defaults.get(k) != v}


def settings_sentence(columns: Figures, st: Figures) -> str:
    """The caption's account of each column's settings, from the record's per-column figures
    (records before them: the sentence those records were published with)."""
    if not columns:
        return ("hardened/bucketed use an fp16 wire at 2^12, every parameter's replica compared "
                f"within {st['replica_check_every']} steps, {fixed(st['watchdog_s'], 0)} s "
                "watchdog.")
    marked = {c: d for c, v in columns.items() if (d := non_default_settings(v))}
    said = "; ".join(f"{c}: " + ", ".join(f"{k} {run} (default {default})"
                                          for k, (run, default) in d.items())
                     for c, d in marked.items())
    defaults = [c for c, v in columns.items() if v["sync"]["name"] == "hardened"
                and c not in marked]
    return (f"{NON_DEFAULT} = run with settings other than its strategy's defaults (for the "
            "hardened columns, other than what `harden(model)` gives): " + (said or "none")
            + "." + (f" {', '.join(defaults)}: `harden(model)` exactly as users call it, every "
                     "setting at its default." if defaults else ""))


def column_header(name: str, columns: Figures) -> str:
    marked = name in columns and non_default_settings(columns[name])
    return f"{name} {NON_DEFAULT}" if marked else name


def fault_tables(sec: Figures, cfg: Figures) -> list[Table]:
    st, cases, alignment = sec["settings"], sec["cases"], sec["bucket_alignment"]
    columns = sec.get("columns") or {}
    strategies = list(dict.fromkeys(c["strategy"] for c in cases))
    faults = list(dict.fromkeys(c["fault"] for c in cases))
    cell = {(c["fault"], c["strategy"]): c["cell"] for c in cases}
    steps = st["train"]["steps"] if "train" in st else st["steps"]  # records before the sections
    matrix = Table(
        f"Each cell: a {steps}-step run of the tiny preset on {st['world_size']} gloo "
        f"ranks with the fault injected on the last rank at step {st['fault_step']}; "
        f"{settings_sentence(columns, st)} Outcome: "
        "detected (with the attribution it gave) / silent-corruption (replicas diverge or the "
        "result differs from the fault-free run) / hang-timeout / crash / no-effect. seed-f5: "
        "text 000's F5 hook as written (forward hook before wrapping, ×2^12 never undone, "
        "rank-0 assertion over its own shapes) on stock DDP; fault 'none': its fault-free run "
        "against stock ddp's." + _hook_columns(sec.get("powersgd")),
        ["fault"] + [column_header(s, columns) for s in strategies],
        [[f] + [cell.get((f, s), "") for s in strategies] for f in faults])
    layouts = Table(
        f"Bucket layouts recorded on every rank ({max(cfg['world_sizes'])} ranks) at every step "
        f"of a 6-step run with a {cfg['bucket_cap_mb']} MB bucket cap (stock DDP via a "
        "recording comm hook): text 000's M3.",
        ["strategy", "ranks", "identical on all ranks", "buckets", "detail"],
        [[a["strategy"], a["world_size"], yes(a["aligned"], "NO"), a["buckets"], a["detail"]]
         for a in alignment])
    return [matrix, layouts]


def overflow_tables(sec: Figures, cfg: Figures) -> list[Table]:
    rates, mismatch = sec["rates"], sec["scale_mismatch"]
    sizes = sorted({r["world_size"] for r in rates})
    overflow = Table(
        f"Overflowed (inf/NaN) gradient elements after the sync at {sizes} ranks, "
        f"{cfg['overflow_steps']} batches with the weights held fixed. Workload 'real': the "
        "model's own gradients (max/min nonzero |g| per step shown); 'harsh': each element "
        "also × 10^U(-2, 2). hardened-fp16 is text 000's F3 (one uniform 2^12 on every rank, "
        "removed after the sum); -auto is this suite's agreed dynamic scale. Text 000's F3 "
        "figure is 0.017%.",
        ["strategy", "workload", "ranks", "overflow (elements)", "overflowed / elements",
         "skipped steps", "min max/min |g|"],
        [[r["strategy"], r["workload"], r["world_size"], f"{fixed(100 * r['overflow_rate'], 4)}%",
          f"{r['overflow_elements']} / {r['elements']}", r["skipped_steps"],
          f"{r['min_dynamic_range']:.2e}"] for r in rates])
    m4 = Table(
        f"Text 000's M4: stock DDP buckets ({cfg['bucket_cap_mb']} MB cap) through PyTorch's "
        "fp16_compress_hook (cast to fp16, ÷W, fp16 sum) after each rank pre-scales by its own "
        "2^e (2^12 on every rank but the last, 2^10 on the last), each rank then dividing by "
        f"its own 2^e; {cfg['mismatch_steps']} batches per row, weights fixed. Overflowed: the "
        "fp16 sum holds an inf; corrupted: some rank's average is off the fp32 average by more "
        "than fp16 rounding allows. Uniform: the same gradients with one 2^12 on every rank. "
        "Accumulator: text 000's picture, the fp16 wires summed without ÷W.",
        ["ranks", "workload", "allreduces", "overflowed", "corrupted", "replicas disagree",
         "uniform: overflowed", "uniform: corrupted", "accumulator: overflowed",
         "accumulator uniform: overflowed"],
        [[m["world_size"], m["workload"], m["allreduces"], m["overflowed"], m["corrupted"],
          m["replicas_disagree"], m["overflowed_uniform"], m["corrupted_uniform"],
          m["overflowed_accumulator"], m["overflowed_accumulator_uniform"]] for m in mismatch])
    return [overflow, m4]


def precision_tables(sec: Figures, cfg: Figures) -> list[Table]:
    return [Table(
        f"Text 004's table on this machine: the {cfg['preset']} preset, global batch "
        f"{cfg['global_batch']} (so per-rank batch shrinks with ranks), median over "
        f"{cfg['repeats']} interleaved repeats of the median step of the slowest rank; peak "
        "memory per rank of each run (resident high-water mark reset at the run's start on "
        "CPU: scope 'run'), largest over repeats.",
        ["configuration", "s/iter", "s/iter per repeat", "peak MiB/rank", "memory scope",
         "final loss"],
        [[r["label"], fixed(r['s_per_iter'], 4),
          " ".join(fixed(x, 4) for x in r["s_per_iter_repeats"]), fixed(r['peak_mib'], 0),
          r["peak_memory_scope"], fixed(r['final_loss'], 4)] for r in sec["rows_data"]])]


def raw_allreduce_tables(sec: Figures, cfg: Figures) -> list[Table]:
    return [Table(
        f"One flat allreduce of all {sec['elements']} gradient elements of the "
        f"{cfg['preset']} preset, median of {sec['iterations']} (slowest rank, after a "
        "barrier). busbw = algbw × 2(n−1)/n (nccl-tests).",
        ["ranks", "wire", "bytes", "median ms", "algbw GB/s", "busbw GB/s"],
        [[r["world_size"], r["wire"], r["bytes"], fixed(r['median_ms'], 3),
          fixed(r['algbw_gbps'], 3), fixed(r['busbw_gbps'], 3)] for r in sec["rows_data"]])]


def ablation_tables(sec: Figures, cfg: Figures) -> list[Table]:
    barrier = sec["skew_barrier"]
    sparsity = {arm: sec["sparsity"][arm] for arm in sec["sparsity_arms"]}  # the run's order
    w = next(iter(sparsity.values()))["world_size"]
    skew = Table(
        f"Per-bucket skew of hardened fp32 on {w} ranks, {cfg['repeats']} × {cfg['steps']} "
        "steps, with the sparse gating unit masking per text 000's schedule vs masking off: is "
        "the skew caused by the sparse path (C4)?",
        ["gating", "bucket-steps", "share > 3 ms", "skew p50 ms", "skew p99 ms"],
        [[k, v["bucket_steps"], f"{fixed(100 * v['share_over_3ms'], 1)}%",
          fixed(v["skew_p50_ms"], 2), fixed(v["skew_p99_ms"], 2)] for k, v in sparsity.items()])
    p2 = Table(
        f"Text 000's P2 policy on {barrier[0]['world_size']} ranks (hardened fp32, tiny preset, "
        f"{cfg['repeats']} × {cfg['steps']} steps per arm, arms interleaved, each rank sleeping "
        "a seeded Δt ∈ [0.3, 5.7] ms before every backward): medians over repeats.",
        ["barrier", "step ms", "std of ready times ms (median)", "std of ready times ms (p90)",
         "max bucket skew ms", "barriers / steps"],
        [[r["arm"], fixed(r['median_step_ms'], 1), fixed(r['median_ready_std_ms'], 2),
          fixed(r['p90_ready_std_ms'], 2), fixed(r['median_skew_ms'], 2),
          f"{r['barriers']} / {r['steps']}"] for r in barrier])
    return [skew, p2]


def _fixed_or_dash(x: float | None, digits: int) -> str:
    return "-" if x is None else fixed(x, digits)


def lightning_tables(sec: Figures, cfg: Figures) -> list[Table]:
    if "error" in sec:
        return []
    return [Table(
        f"A real Lightning run (text 004's L2/L4) on this machine: `{sec['command']}`; "
        "steps/s over the timed steps (first 2 excluded).",
        ["accelerator", "devices", "precision", "strategy", "steps", "steps/s", "final loss",
         "seed_everything(workers=True)", "WeightedRandomSampler"],
        [[sec["accelerator"], sec["devices"], sec["precision"], "ddp", sec["steps"],
          _fixed_or_dash(sec["steps_per_s"], 2), _fixed_or_dash(sec["final_loss"], 4),
          yes(sec["seed_everything_workers"]), yes(sec["weighted_sampler"])]])]


def quantization_tables(sec: Figures, cfg: Figures) -> list[Table]:
    if "error" in sec:
        return []
    fx = f"; text 004's FX path failed here: {sec['fx_error']}" if sec["fx_error"] else ""
    return [Table(
        f"Int8 quantization (text 004's L4) of the {cfg['preset']} model after "
        f"{sec['trained_steps']} training steps in one process: accuracy on the "
        f"{sec['samples']} validation samples, median latency of one forward over them on 1 "
        f"thread ({sec['latency_repeats']} repeats). Method: {sec['method']}{fx}",
        ["engine", "accuracy fp32", "accuracy int8", "Δ accuracy", "latency fp32 ms",
         "latency int8 ms"],
        [[sec["backend"], fixed(sec['accuracy_fp32'], 4), fixed(sec['accuracy_int8'], 4),
          fixed(sec['accuracy_delta'], 4, sign=True), fixed(sec['latency_fp32_ms'], 2),
          fixed(sec['latency_int8_ms'], 2)]])]


# Section → (heading, its tables), in the document's order.
SECTION_TABLES: dict[str, tuple[str, Callable[[Figures, Figures], list[Table]]]] = {
    "faults": ("Fault × strategy outcomes", fault_tables),
    "corpus": ("Published DDP silent errors", corpus_tables),
    "false_alarms": ("Healthy jobs the guard must not stop, faults it must name",
                     false_alarm_tables),
    "overflow": ("FP16 overflow", overflow_tables),
    "precision": ("Text 004: precision × devices", precision_tables),
    "raw_allreduce": ("Raw allreduce of the same bytes", raw_allreduce_tables),
    "ablations": ("Controls the source texts did not run", ablation_tables),
    "lightning": ("Text 004: a Lightning run", lightning_tables),
    "quantization": ("Text 004: int8 quantization", quantization_tables),
    "hook_cost": ("What harden() costs, and its verification at scale",
                  hook_cost_tables),
    "fsdp_cost": ("What harden() costs an FSDP2 job", fsdp_cost_tables),
    "fsdp_corpus": ("Published FSDP2 mistakes: stock FSDP2 and harden()",
                    fsdp_corpus_tables),
    "sdc": ("A rank whose hardware computes wrong: the compute canary", sdc_tables),
    "tp_corpus": ("FSDP2 × tensor parallel: healthy set-ups and published TP/SP mistakes",
                  tp_corpus_tables),
}
