"""The captioned tables of the ``sdc`` section: who notices a rank whose hardware computes
wrong (stock DDP, ``harden()`` with the compute canary off and on), the canary's detection rate
of intermittent and data-dependent faults, and the healthy jobs it must leave alone. Every word
is written here, from the figures the section stored."""

from __future__ import annotations

from openclaw_ref.reporting.table import Figures, Table, yes

FAULT_WORDS = {
    "sdc-ulp": "persistent 1-ulp error, every matmul",
    "sdc-forward": "1-ulp error, forward matmuls only",
    "sdc-backward": "1-ulp error, backward matmuls only (local gradient)",
    "sdc-flip-low": "low-mantissa bit flip (bit 3) in backward matmuls",
    "sdc-flip-high": "high-exponent bit flip (bit 30) in backward matmuls",
    "sdc-threshold": "1-ulp error when an input exceeds a magnitude",
}


def sdc_cell(case: Figures, fault_step: int) -> str:
    """One cell: the outcome, and for a detection the error, the steps after the fault took
    effect, the ranks and the first parameter named."""
    if case["outcome"] != "detected":
        return case["outcome"]
    ranks = ", ".join(str(r) for r in case["ranks"])
    first = f"; {case['params'][0]}" if case["params"] else ""
    return (f"detected ({case['error']}, step {case['step']} = fault + "
            f"{case['step'] - fault_step}, rank {ranks}{first})")


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
        "the canary names rank 1 and says either side may be the faulty one; with 4 the outlier. "
        "The intermittent flips fire on the fraction of calls after '=', the data-dependent "
        "fault above the magnitude after '=' (their rates over many probes: next table).",
        ["ranks", "fault", "what it models", *columns], rows)


def sdc_rate_table(sec: Figures) -> Table:
    rows = [[r["fault"], r["value"], r["probes"], r["detected"], r["right_rank"],
             f"{r['detected'] / r['probes']:.0%}", r["fired"]] for r in sec["rates"]]
    return Table(
        "The canary's detection rate of faults that fire on some calls only (2 gloo ranks, the "
        "fault on rank 1): each trial a fresh run whose fault starts just before one probe "
        "(after the start-up probe) and ends at that probe's verdict, data and the fault's "
        "call sequence shifted per trial. A flip fires on VALUE of the backward's matmul calls; "
        "the threshold fault on calls whose first operand holds an element above VALUE. A probe "
        "runs a handful of matmuls, so the rate per probe is about 1 − (1 − VALUE)^calls, not "
        "VALUE; a fault that fires between probes is not seen until one fires in a probe. "
        "fired: corrupted results over all trials (steps and probes).",
        ["fault", "value", "probes", "named", "right rank", "rate", "fired"], rows)


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


def sdc_tables(sec: Figures, cfg: Figures) -> list[Table]:
    return [sdc_corpus_table(sec), sdc_rate_table(sec), sdc_healthy_table(sec)]
