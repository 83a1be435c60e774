"""PNG plots of a comparison (matplotlib, Agg backend, no timestamps: re-rendering is
byte-stable)."""

from __future__ import annotations

import io
from pathlib import Path

from openclaw_ref.core.jsonio import write_bytes_atomic
from openclaw_ref.reporting.record import RunRecord


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None}, bbox_inches="tight")
    _figure().close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def plot_loss_curves(raw: dict, path: Path) -> Path | None:
    curves = raw.get("curves") or {}
    if not curves:
        return None
    plt = _figure()
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    for label, c in curves.items():
        ax_train.plot(range(len(c["loss"])), c["loss"], label=label, lw=1)
        val = c.get("validation", [])
        ax_val.plot([v["step"] for v in val], [v["loss"] for v in val], label=label, lw=1,
                    marker=".", ms=3)
    ax_train.set(title="training loss (mean over ranks)", xlabel="step", ylabel="loss")
    ax_val.set(title="validation loss (every 2 steps) — seed C1: spikes every 37–42 steps?",
               xlabel="step", ylabel="loss")
    for ax in (ax_train, ax_val):
        ax.legend()
        ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_bucket_timeline(raw: dict, path: Path) -> Path | None:
    """One step's per-rank bucket-ready times: the picture the seed's NCCL trace describes."""
    curve = (raw.get("curves") or {}).get("hardened fp32")
    buckets = (curve or {}).get("sync_last", {}).get("buckets") or []
    if not buckets:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    n_ranks = len(buckets[0]["ready_ms"])
    for b in buckets:
        ax.scatter(b["ready_ms"], range(n_ranks), s=18, label=f"bucket {b['index']}")
    ax.set(title=f"bucket-ready time per rank, last step of the hardened run "
                 f"(×{curve['world_size']} ranks)",
           xlabel="ms since the rank's step start", ylabel="rank",
           yticks=list(range(n_ranks)))
    ax.legend(fontsize=7, ncol=4)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_step_times(raw: dict, path: Path) -> Path | None:
    runs = [r for r in (raw.get("strategies") or {}).get("runs", []) if "error" not in r]
    if not runs:
        return None
    w = max(r["world_size"] for r in runs)
    variants = list(dict.fromkeys(r["variant"] for r in runs if r["world_size"] == w))
    data = [[ms for r in runs if r["variant"] == v and r["world_size"] == w
             for ms in r["step_ms"][2:]] for v in variants]
    plt = _figure()
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(variants) + 1), variants, rotation=25, ha="right", fontsize=8)
    ax.set(title=f"step time distribution at {w} ranks (all repeats, warm-up excluded)",
           ylabel="step ms (slowest rank)")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_overflow_vs_scale(raw: dict, path: Path) -> Path | None:
    points = (raw.get("overflow") or {}).get("vs_scale") or []
    if not points:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label in sorted({p["strategy"] for p in points}):
        ps = sorted((p for p in points if p["strategy"] == label), key=lambda p: p["scale_exp"])
        ax.plot([p["scale_exp"] for p in ps], [100 * p["overflow_rate"] for p in ps],
                marker="o", label=label)
    ax.axhline(0.017, color="grey", ls="--", lw=1, label="seed F3: 0.017%")
    ax.set(title="FP16 overflowed elements vs pre-scale (high-dynamic-range gradients)",
           xlabel="pre-scale exponent e (scale = 2^e)", ylabel="overflowed elements (%)",
           yscale="symlog")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def render_plots(rec: RunRecord, out_dir: Path) -> list[Path]:
    """Every plot the record has data for (a plot without data is skipped, not drawn empty)."""
    raw = rec.doc
    made = [plot_loss_curves(raw, out_dir / "loss_curves.png"),
            plot_bucket_timeline(raw, out_dir / "bucket_timeline.png"),
            plot_step_times(raw, out_dir / "step_times.png"),
            plot_overflow_vs_scale(raw, out_dir / "overflow_vs_scale.png")]
    return [p for p in made if p is not None]
