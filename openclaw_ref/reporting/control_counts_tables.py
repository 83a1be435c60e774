"""The table of the hardened hook's counted step block (``experiments.verify_scale
.measure_counts``): bytes per step and clean-check time per bucket as W and B grow. Wording
only; every figure comes from the section's raw record."""

from __future__ import annotations

from openclaw_ref.reporting.table import Figures, Table, fixed


def counted_block_table(rows: list[Figures]) -> Table:
    return Table(
        "The hardened hook's counted step block (one process, a synthesized clean step, median "
        "of 9 checks, the one host read included): bytes per step on each wire and the "
        "per-rank block it replaces (22 fp32 elements per rank per bucket); beyond 64 ranks "
        "ready times are binned, beyond a wire's exact-integer limit (fp16 2,048, bf16 256 "
        "ranks) the counts are kept per group.",
        ["ranks", "buckets", "check µs/bucket", "step bytes fp32", "fp16", "bf16",
         "per-rank block bytes fp32"],
        [[r["world_size"], r["buckets"], fixed(r["check_us_per_bucket"], 1),
          r["step_bytes_fp32"], r["step_bytes_fp16"], r["step_bytes_bf16"],
          r["per_rank_step_bytes_fp32"]] for r in rows])
