"""Rendering run records as tables (tabulate, GitHub format)."""

from __future__ import annotations

from tabulate import tabulate


def _fmt_mb(values: list[float]) -> str:
    return f"{max(values):.0f}" if values else "-"


def train_summary_table(record: dict) -> str:
    """The summary ``openclaw-bench train`` prints: one row, correctness beside speed."""
    cfg, s, env = record["config"], record["summary"], record["environment"]
    row = {
        "sync": cfg["sync"]["name"] + ("" if cfg["sync"]["wire"] == "fp32" else f"/{cfg['sync']['wire']}"),
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
