"""The captioned tables of the ``hook_cost`` section: per model, each arm's step and its ratio
to stock DDP; across the models, the ratios between two arms of the same job (the pairs the job
stored: the guard beside the floor, beside PyTorch's Python hook, a variant beside the arm it
extends); the memory each arm holds; verifying a step's control blocks at scale. Every word is
written here, from the figures the section stored."""

from __future__ import annotations

from openclaw_ref.reporting.control_counts_tables import counted_block_table
from openclaw_ref.reporting.table import Figures, Table, fixed, interval, ratio_cell

# What each arm is, for the captions (an arm not listed is named only)
ARM_WORDS = {
    "ddp": "stock DDP, its C++ allreduce (the baseline)",
    "floor": "stock DDP plus one bare exchange per step of exactly the step guard's bytes, "
             "issued where the guard issues it and waited on before the optimizer, nothing "
             "checked: what any guard that reads a per-step verdict before the optimizer pays",
    "floor+nancheck": "the floor plus the guard's hook on each gradient accumulator, summing "
                      "the gradient as it is accumulated, and the NaN flag read before the "
                      "exchange (the guard's hooks also record presence, so this arm carries "
                      "their Python calls too)",
    "allreduce_hook": "PyTorch's Python default_hooks.allreduce_hook",
    "fp16_compress_hook": "PyTorch's Python default_hooks.fp16_compress_hook",
    "hardened": "harden()'s defaults, the step guard (DDP's own C++ reduction, one small "
                "exchange per step)",
    "hardened-fp16": "the step guard on DDP's built-in fp16 wire",
    "hardened-noreplica": "the step guard without the replica digest",
    "hardened+canary": "the step guard with the compute canary probing every step",
    "hardened-bucket-fp32": "the per-bucket guard (a Python comm hook checking every bucket, "
                            "the forensic mode), fp32 wire",
}
# What a ratio between two arms says (a pair not listed is shown without a gloss)
PAIR_WORDS = {
    ("hardened", "floor"): "what the guard's checks cost above the one collective",
    ("hardened", "allreduce_hook"): "the default guard beside PyTorch's own Python hook",
    ("hardened+canary", "hardened"): "what the compute canary adds",
    ("floor+nancheck", "floor"): "a hook per gradient and one pass over it (the NaN flag)",
    ("hardened-noreplica", "floor+nancheck"): "the guard's bookkeeping above its hooks",
    ("hardened", "hardened-noreplica"): "the replica digest (one slice per step)",
}


def hook_cost_table(model: str, job: Figures) -> Table:
    """One interleaved hook-cost job: each arm's step, its ratio to the baseline arm (stock
    ddp) with its interval, its cost per bucket beyond the baseline's."""
    summary, hcfg, base = job["summary"], job["config"], job["baseline"]
    arms = [a for a in hcfg["arms"] if a in summary]  # the job's order, not the JSON's
    rows = []
    for arm in arms:
        s = summary[arm]
        if arm == base:
            rows.append([arm, fixed(s["median_step_ms"], 2), "1", ""])
            continue
        rows.append([arm, fixed(s["median_step_ms"], 2),
                     ratio_cell(s["ratio"], s["ratio_low"], s["ratio_high"]),
                     interval(s["per_bucket_us"], s["per_bucket_us_low"],
                              s["per_bucket_us_high"], 0)])
    words = "; ".join(f"{a} = {ARM_WORDS[a]}" for a in arms if a in ARM_WORDS)
    return Table(
        f"Per-step cost of harden() and of PyTorch's comm hooks, model {model} "
        f"({summary[base]['buckets']} buckets), {hcfg['world_size']} gloo ranks × 1 thread, "
        f"{hcfg['steps']} steps per arm, arms interleaved step by step in one job (order "
        f"rotating). {words}. Ratio = median of the per-step ratios to {base}'s step with a "
        "95 % bootstrap interval; where it contains 1 the difference is inside the noise "
        f"here. µs/bucket = the extra over {base} spread over the buckets.",
        ["arm", "median step ms", f"÷ {base} [95 %]", "extra µs/bucket [95 %]"],
        rows)


def pairs_table(jobs: Figures) -> Table | None:
    """The ratios between two arms of the same job, one row per pair (in the order the jobs
    stored them), one column per model; None when no job stored a pair."""
    models = list(jobs)
    # row label → (what it says, cell per model), in the order the jobs stored the pairs
    cells: dict[str, tuple[str, dict[str, str]]] = {}
    amortized_note = ""
    for model, job in jobs.items():
        for p in job.get("pairs", []):
            label, words = f"{p['arm']} ÷ {p['over']}", PAIR_WORDS.get((p["arm"], p["over"]), "")
            cells.setdefault(label, (words, {}))[1][model] = ratio_cell(
                p["ratio"], p["ratio_low"], p["ratio_high"])
            if "probe_every" in p:
                k = p["amortize_over"]
                cells.setdefault(f"{label} at K = {k}", (words, {}))[1][model] = ratio_cell(
                    *(amortized(p[f], p["probe_every"], k)
                      for f in ("ratio", "ratio_low", "ratio_high")))
                amortized_note = (
                    f" The canary arm probes every {p['probe_every']} step(s), so its ratio is "
                    "what one probe step costs (a cost paid once every K steps is invisible to "
                    "a median of per-step ratios); the row 'at K' spreads it over the "
                    f"recommended K = {k}: 1 + (ratio − 1) × {p['probe_every']} ÷ K, bounds "
                    "alike — arithmetic on the measured ratio, not a run at that K.")
    if not cells:
        return None
    rows = [[label, words] + [by_model.get(m, "") for m in models]
            for label, (words, by_model) in cells.items()]
    return Table(
        "Ratios between two arms of the same interleaved job (the tables above): the median of "
        "the per-step ratios of one arm's step to the other's, with a 95 % bootstrap interval; "
        "where it contains 1 the difference is inside the noise here." + amortized_note,
        ["ratio", "what it says"] + [f"{m} [95 %]" for m in models],
        rows)


def amortized(ratio: float, probe_every: int, k: int) -> float:
    """A per-probe-step ratio spread over a probe every ``k`` steps."""
    return 1.0 + (ratio - 1.0) * probe_every / k


def _memory_table(rows: list[Figures]) -> Table:
    by = {(r["arm"], r["gradient_as_bucket_view"]): r for r in rows}
    out = []
    for r in rows:
        base = by[("ddp", r["gradient_as_bucket_view"])]["step_peak_growth_mb"]
        out.append([r["arm"], "on" if r["gradient_as_bucket_view"] else "off",
                    fixed(r['hook_held_mb'], 2), fixed(r['step_peak_growth_mb'], 1),
                    fixed(r['step_peak_growth_mb'] - base, 1, sign=True)])
    return Table(
        f"Memory of one rank, the MLP ({fixed(rows[0]['gradient_mb'], 1)} MiB of fp32 gradients), "
        "one arm at a time: what the guard or hook holds between steps (counted from its live "
        "buffers), and the peak growth within steady-state steps after DDP's bucket rebuild "
        f"(scope: {rows[0]['scope']}; ranks run with MALLOC_MMAP_THRESHOLD_=65536 so the "
        "resident peak counts live tensors).",
        ["arm", "gradient_as_bucket_view", "held by the guard MiB", "step peak growth MiB",
         "vs ddp MiB"],
        out)


def _verify_table(rows: list[Figures]) -> Table:
    slot_fields = rows[0]["block_bytes_fp32"] // (4 * rows[0]["world_size"])
    return Table(
        f"Verifying a step's control blocks, one process, {rows[0]['buckets']} synthesized "
        f"buckets (median of 9). Block = {slot_fields} elements × W; share = fp32 block ÷ a "
        "25 MB bucket.",
        ["ranks", "check_blocks µs/bucket", "decode+verify µs/bucket", "block bytes fp32",
         "share of 25 MB"],
        [[r["world_size"], fixed(r['check_blocks_us_per_bucket'], 1),
          fixed(r['decode_verify_us_per_bucket'], 0), r["block_bytes_fp32"],
          f"{fixed(100 * r['share_of_25mb_fp32'], 2)} %"] for r in rows])


def hook_cost_tables(sec: Figures, cfg: Figures) -> list[Table]:
    counted = [counted_block_table(sec["verify_counts"])] if "verify_counts" in sec else []
    pairs = pairs_table(sec["jobs"])
    return ([hook_cost_table(model, job) for model, job in sec["jobs"].items()]
            + ([pairs] if pairs else [])
            + [_memory_table(sec["memory"]), _verify_table(sec["verify"])] + counted)
