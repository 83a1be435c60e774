"""The captioned tables of the two FSDP2 sections: ``fsdp_cost`` (hardened ÷ stock FSDP2,
interleaved, one row per mesh and world size with the job's correctness beside it) and
``fsdp_corpus`` (published FSDP2 mistakes, stock FSDP2 beside harden()'s defaults). Every word
is written here, from the figures the sections stored."""

from __future__ import annotations

from openclaw_ref.reporting.table import Figures, Table, fixed, ratio_cell, yes


def fsdp_cost_mesh(config: Figures) -> str:
    """A job's mesh in words: 1-D, or its (dp, tp) shape."""
    tp = config.get("tp", 1)
    return "1-D" if tp == 1 else f"(dp, tp) = ({config['world_size'] // tp}, {tp})"


def fsdp_cost_events(job: Figures) -> str:
    """The guard's events: their count, and by kind where the record has them."""
    kinds = job.get("event_kinds") or {}
    return str(job["events"]) + (" (" + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ")"
                                 if kinds else "")


def fsdp_cost_row(job: Figures) -> list[str]:
    """One job: its mesh and ranks, both arms' median steps, hardened ÷ stock with its
    interval, and the same job's correctness and load."""
    summary, base = job["summary"], job["baseline"]
    (arm,) = [a for a in summary if a != base]
    s, load = summary[arm], job.get("load_average")
    return [fsdp_cost_mesh(job["config"]), str(job["config"]["world_size"]),
            fixed(summary[base]["median_step_ms"], 2), fixed(s["median_step_ms"], 2),
            ratio_cell(s["ratio"], s["ratio_low"], s["ratio_high"]),
            yes(job["bitwise_equal"], "NO"), f"{job['exchanges']} / {job['optimizer_steps']}",
            fsdp_cost_events(job),
            "" if load is None else f"{fixed(load[0], 1)} → {fixed(load[1], 1)}"]


def fsdp_cost_table(jobs: Figures) -> Table:
    """Every interleaved FSDP2 job of the section, one row each, so the 2-D mesh's ratio
    stands beside the 1-D mesh's at the same world size."""
    first = next(iter(jobs.values()))
    fcfg, model = first["config"], first["config"]["model"]
    return Table(
        f"Per-step cost of harden() on FSDP2, model {model} (8 × Linear(512, 512), SGD), "
        f"gloo ranks × 1 thread, {fcfg['steps']} steps per arm after {fcfg['warmup']} "
        "warm-up, the two arms interleaved step by step in one job per row (order rotating); "
        "a step = forward, backward, optimizer step, zero_grad. Mesh 1-D: fully_shard on each "
        "Linear and the root over every rank. Mesh (dp, tp): ColwiseParallel then "
        "RowwiseParallel on the 1st and 3rd pairs of Linear layers, the other four layers left "
        "out of the plan (plain parameters replicated over tp), fully_shard over dp; the tp "
        "ranks of a dp group fed the same batch. stock = fully_shard as shipped; hardened = "
        "harden(model) with its defaults (FSDP2's own reduce-scatter wrapped, one small int64 "
        "allreduce of world × its fields at the optimizer step; on the (dp, tp) mesh the same "
        "exchange also compares the parameters replicated over tp and the digest of the "
        "batch across the tp group). Ratio = median of the per-step ratios to stock's step "
        "with a 95 % bootstrap interval; where it contains 1 the difference is inside the "
        "noise here. Where the ranks outnumber the host's cores they time-share, and each "
        "step measures the host as much as the guard. Same job: parameters bitwise equal "
        "between the arms at the end; the guard's exchanges / optimizer steps (warm-up "
        "included); the guard's events by kind (CanaryOff, said once at harden() on the "
        "(dp, tp) mesh, is the compute canary turning itself off: its probe cannot run a "
        "TP-sharded model, so neither arm pays for it there; any other kind would be a false "
        "alarm); the host's 1-minute load average before → after the job.",
        ["mesh", "ranks", "stock ms", "hardened ms", "hardened ÷ stock [95 %]",
         "bitwise equal", "exchanges / steps", "events", "load"],
        [fsdp_cost_row(job) for job in jobs.values()])


def fsdp_cost_tables(sec: Figures, cfg: Figures) -> list[Table]:
    return [fsdp_cost_table(sec["jobs"])] if sec.get("jobs") else []


FSDP_COLUMN_TITLES = {"stock": "stock FSDP2", "hardened": "harden() defaults"}


def _fsdp_mesh(mesh: str, world: int) -> str:
    if mesh == "hsdp":
        return f"an HSDP mesh ({world // 2} replicas × 2 shards)"
    return "a 1-D mesh (every rank shards)" if mesh == "fsdp" else mesh


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def fsdp_corpus_cell(case: Figures) -> str:
    """An outcome in words: the error class, the step and the ranks named (detected, crash,
    hang); silent corruption with its largest |Δparameter|; no-effect as is."""
    kind = case["outcome"]
    if kind == "silent-corruption":
        said = (["replicas differ"] if case.get("replicas_differ") else []) + (
            [f"max Δ {case['max_abs_diff']:.1e}"] if case.get("max_abs_diff") is not None
            else [])
        return f"{kind} ({'; '.join(said)})" if said else kind
    parts = [case["error"]] if case.get("error") else []
    if case.get("step") is not None:
        parts.append(f"step {case['step']}")
    elif kind == "detected":
        parts.append("at harden()")  # the start-up check, before any step
    if case.get("ranks"):
        parts.append(_ranks(case["ranks"]))
    if case.get("failed_error"):  # detected by some ranks, the others ended in the backend
        parts.append(f"{_ranks(case['failed_ranks'])} ended by {case['failed_error']}")
    return f"{kind} ({'; '.join(parts)})" if parts and kind != "no-effect" else kind


def _fsdp_source(p: Figures) -> str:
    if p["name"] == "none":
        return "— (the script without a mistake)"
    return f"[{p['source']}]({p['url']})" if p.get("url") else p["source"]


def fsdp_corpus_tables(sec: Figures, cfg: Figures) -> list[Table]:
    """One table per (mesh, ranks): pattern | public source | one column per column run."""
    st, patterns, cases = sec["settings"], sec["patterns"], sec["cases"]
    tables = []
    for mesh, world in dict.fromkeys((c["mesh"], c["world_size"]) for c in cases):
        here = [c for c in cases if (c["mesh"], c["world_size"]) == (mesh, world)]
        columns = list(dict.fromkeys(c["column"] for c in here))
        cell = {(c["pattern"], c["column"]): c for c in here}
        mistakes = [p["name"] for p in patterns if p["name"] != "none"]
        caught = {col: sum(1 for n in mistakes
                           if cell.get((n, col), {}).get("outcome") == "detected")
                  for col in columns}
        tables.append(Table(
            f"Published FSDP2 mistakes as a plain user script "
            "(openclaw_ref/fsdp_corpus/silent_errors_script.py: a 5-layer MLP, fully_shard on "
            f"three of its Linear layers and the root, AdamW, {st['batch_per_rank']} samples "
            f"per rank), each a {st['steps']}-step run under torchrun on {world} gloo ranks × 1 "
            f"thread with {_fsdp_mesh(mesh, world)}, judged against the same column's "
            f"run without the mistake. A one-rank pattern acts on rank {st['fault_rank']} "
            f"(load-one-rank: rank 0, the one that loads) from step {st['fault_step']} "
            "(construction-time ones from the start); process-group timeout "
            f"{fixed(st['timeout_s'], 0)} s. stock FSDP2 = fully_shard as shipped; harden() "
            "defaults = harden(model) right after fully_shard, every setting at its default. "
            "Outcome: detected (the error it raised, the step, the ranks it named; every rank "
            "stopped before the optimizer applied the step — by that error, or, where said, "
            "'ended by': inside FSDP2's own collective, gloo aborting it (SIGABRT) or timing "
            "out (RuntimeError), while its peers raised the error) / silent-corruption (the result "
            "differs from the run without the mistake, or the replicas differ; max Δ: the largest"
            " absolute difference of a parameter from it) / crash (how the first rank to fail "
            "stopped — SIGABRT: gloo aborted the process on a collective size mismatch — its "
            "step, the ranks that failed first) / hang-timeout (the ranks that waited out the "
            "timeout: RuntimeError from gloo, or their watchdog) / no-effect (bitwise equal to "
            "the run without it). "
            "Caught: " + ", ".join(f"{FSDP_COLUMN_TITLES.get(c, c)} {caught[c]} of "
                                   f"{len(mistakes)}" for c in columns) + ".",
            ["pattern", "public source"] + [FSDP_COLUMN_TITLES.get(c, c) for c in columns],
            [[p["name"], _fsdp_source(p)]
             + [fsdp_corpus_cell(cell[(p["name"], c)]) if (p["name"], c) in cell else ""
                for c in columns] for p in patterns]))
    return tables
