"""The captioned table of the ``false_alarms`` section (pattern × stock DDP / hardened →
measured outcome), from the figures the section stored; every word is written here."""

from __future__ import annotations

from openclaw_ref.reporting.table import Figures, Table, fixed


def _cell(row: Figures) -> str:
    error = row.get("error")
    if error is None:
        return row["outcome"]
    ranks = f" ranks {error['ranks']}" if error.get("ranks") else ""
    return f"{row['outcome']} ({error['kind']}{ranks})"


def _distance(row: Figures) -> str:
    value = row.get("max_relative")
    return "-" if value is None else f"{value:.1e}"


def false_alarm_tables(sec: Figures, cfg: Figures) -> list[Table]:
    st, rows = sec["settings"], sec["rows"]
    tables = []
    for w in sorted({r["world_size"] for r in rows}):
        mine = [r for r in rows if r["world_size"] == w and "outcome" in r]
        patterns = list(dict.fromkeys(r["pattern"] for r in mine))
        cell = {(r["pattern"], r["arm"]): r for r in mine}
        parity = "bitwise" if w <= 2 else (
            f"within {st['relative_limit']:g} relative; {st['fp16_relative_limit']:.2g} for an "
            "fp16 wire: the control block lengthens its last bucket, which gloo's ring then "
            "splits, and sums in fp16, in another order than fp16_compress_hook's")
        tables.append(Table(
            f"{w} gloo ranks, a tiny MLP with rank-dependent inputs, each pattern run three "
            "times on the same ranks and batches: a reference (stock DDP, no hook, without the "
            "disturbance; PyTorch's fp16_compress_hook for fp16 patterns; the overflowed step "
            f"(step {st['overflow_at']}) not applied for the overflow pattern), stock DDP and "
            f"hardened at its defaults (the pause: {fixed(st['pause_s'], 1)} s on rank 0 "
            f"against a {fixed(st['pause_deadline_s'], 1)} s watchdog deadline instead of the "
            f"default {fixed(st['default_deadline_s'], 0)} s, under the default action, "
            f"{st['pause_action']}). exact: every rank's weights equal the reference's "
            f"({parity}) with the same loss-scale sequence; differs; non-finite weights; false "
            "alarm: an exception on a healthy job; killed: a rank process ended. Fault rows: "
            "right cause (every rank raised the expected error at the same step, naming the "
            "rank, no majority claimed between two ranks; for the refused combination, "
            "BadInput) / misdiagnosed / silent. max rel. diff: the largest distance of any "
            "rank's weights to the reference's, relative to their largest magnitude.",
            ["pattern", "stock DDP", "hardened", "hardened max rel. diff", "hardened events",
             "hardened s"],
            [[p, _cell(cell[p, "stock DDP"]), _cell(cell[p, "hardened"]),
              _distance(cell[p, "hardened"]),
              ", ".join(cell[p, "hardened"]["events"]) or "-",
              fixed(cell[p, "hardened"]["seconds"], 1)] for p in patterns]))
    return tables
