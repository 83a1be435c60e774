"""The captioned tables of the ``sdc`` section: who notices a rank whose hardware computes
wrong (stock DDP, ``harden()`` with the compute canary off and on), the canary's detection rate
of intermittent and data-dependent faults, and the healthy jobs it must leave alone. Every word
is written here, from the figures the section stored."""

from __future__ import annotations

import math

from openclaw_ref.reporting.table import Figures, Table, yes

FAULT_WORDS = {
    "sdc-ulp": "persistent 1-ulp error, every matmul",
    "sdc-forward": "1-ulp error, forward matmuls only",
    "sdc-backward": "1-ulp error, backward matmuls only (local gradient)",
    "sdc-flip-low": "low-mantissa bit flip (bit 3) in backward matmuls",
    "sdc-flip-high": "high-exponent bit flip (bit 30) in backward matmuls",
    "sdc-flip-exp": "low-exponent bit flip (bit 23: x2 or /2) in backward matmuls",
    "sdc-threshold": "1-ulp error when an input exceeds a magnitude",
}


def sdc_cell(case: Figures, fault_step: int) -> str:
    """One cell: the outcome, and for a detection the error, the steps after the fault took
    effect, the ranks and the first parameter named; else the one-offs the canary reported on
    the faulty rank (``CanaryTransient``), if any."""
    if case["outcome"] != "detected":
        reported = case.get("reported") or 0
        return case["outcome"] + (f" (reported {reported}× as a one-off on the faulty rank)"
                                  if reported else "")
    ranks = ", ".join(str(r) for r in case["ranks"])
    first = f"; {case['params'][0]}" if case["params"] else ""
    return (f"detected ({case['error']}, step {case['step']} = fault + "
            f"{case['step'] - fault_step}, {'rank' if len(case['ranks']) == 1 else 'ranks'} "
            f"{ranks}{first})")


def sdc_corpus_table(sec: Figures) -> Table:
    s = sec["settings"]
    columns = list(dict.fromkeys(c["column"] for c in sec["corpus"]))
    cell = {(c["world_size"], c["fault"], c["column"]): c for c in sec["corpus"]}
    rows = []
    for world, fault in dict.fromkeys((c["world_size"], c["fault"]) for c in sec["corpus"]):
        value = next(c["value"] for c in sec["corpus"] if c["fault"] == fault)
        rows.append([world, fault + (f"={value}" if value else ""),
                     FAULT_WORDS.get(fault, fault)]
                    + [sdc_cell(cell[(world, fault, col)], s["fault_step"]) for col in columns])
    return Table(
        "Silent data corruption: the last rank's matmuls (aten.mm/addmm/bmm/baddbmm, fp32) "
        f"compute wrong from step {s['fault_step']} on, in its forward, backward and the "
        "canary's probe alike (core/sdc_faults.py: a dispatch mode on that rank), a plain user "
        f"loop of {s['steps']} steps on an MLP with dropout (SGD, rank-dependent batches). "
        f"Canary on: canary_every = {s['canary_every']}, so a fault must be named within "
        f"{2 * s['canary_every']} steps of taking effect. silent-corruption: nothing raised and "
        "the final weights differ from the fault-free run's; no-effect: nothing raised and the "
        "weights are the same (a 1-ulp error can vanish in the update's rounding). With 2 ranks "
        "there is no majority: the canary names both and says either may be the faulty one; "
        "with 4 the outlier. Every mismatch is confirmed by re-running the probe twice. "
        "The intermittent flips fire on the fraction of calls after '=', the data-dependent "
        "fault above the magnitude after '=' (their rates over many probes: next table).",
        ["ranks", "fault", "what it models", *columns], rows)


def sdc_rate_table(sec: Figures) -> Table:
    rows = [[r["fault"], r["value"], r["probes"], r["named"], r["reported"], r["right_rank"],
             r["wrong_rank"], f"{(r['named'] + r['reported']) / r['probes']:.0%}", r["fired"]]
            for r in sec["rates"]]
    return Table(
        "The canary on faults that fire on some calls only (2 gloo ranks, the fault on rank 1): "
        "each trial a fresh run whose fault starts just before one probe (after the first) and "
        "ends at that probe's verdict, data and the fault's call sequence shifted per trial. A "
        "flip fires on VALUE of the backward's matmul calls; the threshold fault on calls whose "
        "first operand holds an element above VALUE. Every mismatch is confirmed by re-running "
        "the probe twice: named — the difference persisted over the re-runs (ComputeMismatch, "
        "both ranks at 2 ranks); reported — a one-off on one rank (a CanaryTransient event "
        "naming it: raised only when 3 such one-offs beyond the tolerance add up on one rank, "
        "which one probe cannot); right rank — either, naming rank 1; wrong rank — anything "
        "naming only rank 0. A probe runs a handful of matmuls, so the rate per probe is about "
        "1 − (1 − VALUE)^calls, not VALUE. fired: corrupted results over all trials.",
        ["fault", "value", "probes", "named", "reported", "right rank", "wrong rank", "rate",
         "fired"], rows)


def sdc_healthy_table(sec: Figures) -> Table:
    rows = [[h["job"], h["alarms_off"], h["alarms_on"], h["probes"], yes(h["bitwise_equal"], "NO")]
            for h in sec["healthy"]]
    return Table(
        "Healthy jobs the canary must leave alone (2 gloo ranks, 4 steps, a plain user loop, "
        "harden() with the canary off and at every step: canary_every = 1, the most probes a "
        "run can make). Alarms: errors raised plus events, summed over the ranks; bitwise "
        "equal: the weights, buffers and RNG state at the end are the same with the canary on "
        "and off on every rank.",
        ["healthy job", "alarms, canary off", "alarms, canary on", "probes", "bitwise equal"],
        rows)


def _power(x: float | None) -> str:
    """A relative error 2^-j as "2^-j", None as "none up to 2^-1"."""
    if x is None:
        return "none up to 2^-1"
    return f"2^{round(math.log2(x))}"


def sdc_noise_table(sec: Figures) -> Table:
    rows = []
    for r in sec["noise"]:
        if r["skipped"]:
            rows.append([r["model"], r["precision"], "—", "—", "—",
                         f"not run: the model itself fails so ({r['skipped']})"])
            continue
        caught = (f"{_power(r['smallest_caught'])} ({r['caught_distance']:.2g})"
                  if r["smallest_caught"] is not None else _power(None))
        rows.append([r["model"], r["precision"], f"{r['rtol']:g}", f"{r['healthy']:.2g}",
                     f"{r['rtol'] / r['healthy']:.0f}x" if r["healthy"] else "inf", caught])
    return Table(
        "The canary's tolerance, measured (one process, experiments/canary_noise.py): per model "
        "and precision, the largest distance between a clean probe and the same probe under "
        "the emulated GPU noise at its worst (every matmul of the forward and backward moved by "
        "one ulp at a random element; the distance is the largest figure difference over the "
        "whole probe gradient's mass) over the trials, the tolerance's margin over it, and the "
        "smallest relative error of element 0 of every matmul (a persistent fault) whose "
        "distance exceeds the tolerance, with that distance. The tolerance applies only where "
        "ranks cannot be compared bitwise (fingerprints differ, or the job's kernels proved "
        "non-deterministic); elsewhere any persistent difference is named.",
        ["model", "precision", "tolerance", "healthy noise (worst)", "margin",
         "smallest fault caught"], rows)


def sdc_tables(sec: Figures, cfg: Figures) -> list[Table]:
    tables = [sdc_corpus_table(sec), sdc_rate_table(sec), sdc_healthy_table(sec)]
    return tables + ([sdc_noise_table(sec)] if "noise" in sec else [])
