"""Which recorded step ``bucket_timeline.png`` draws, and the caption comparison.md gives it.

Only the per-bucket guard (``hardened per-bucket fp32``) times every bucket: ``harden()``'s
default, the step guard, records one ready time per step (one "bucket" without an index), and
a plot of it would show one point per rank labelled "bucket None". So the timeline is drawn
from a strategy run whose last step holds an indexed ready time per bucket *and* rank; a
record without one gets no plot, and its caption says why. The plot and the caption read the
same ``Timeline``, so they cannot tell different stories.
"""

from __future__ import annotations

from dataclasses import dataclass

from openclaw_ref.reporting.record import RunRecord

PER_BUCKET = "hardened per-bucket fp32"  # the row whose ready times are per bucket
NOT_PER_BUCKET = ("harden()'s default, the step guard, records one ready time per step, not "
                  "per bucket")


@dataclass(frozen=True)
class Timeline:
    """One step of one strategy run: every bucket's ready time on every rank."""

    variant: str
    world_size: int
    repeat: int
    repeats: int  # successful runs of the variant at this size with per-bucket times
    step: int  # the step drawn: the run's last
    buckets: tuple[dict, ...]  # the record's entries: index, ready_ms, skew_ms, late_rank
    oversubscribed: bool  # more ranks than the host's cores (GPUs): skew then times the host

    @property
    def worst(self) -> dict:
        """The bucket with the largest skew (the first such)."""
        return max(self.buckets, key=lambda b: b["skew_ms"])

    @property
    def sized(self) -> bool:
        """Whether the record holds each bucket's size (records since the ``elements`` field)."""
        return all(b.get("elements") for b in self.buckets)

    def label(self, bucket: dict) -> str:
        """A bucket's legend entry: its index, and its size where the record holds it."""
        size = f": {bucket['elements']:,} elements" if self.sized else ""
        return f"bucket {bucket['index']}{size}"

    def which_step(self) -> str:
        """The step in words, for the title and the caption."""
        if self.repeats == 1:
            return f"the last step ({self.step}) of its one run"
        median = "median" if self.repeats % 2 else "lower median"
        return (f"the last step ({self.step}) of repeat {self.repeat}, the repeat with the "
                f"{median} worst-bucket skew of {self.repeats}")


def timed_buckets(run: dict) -> list[dict]:
    """The last step's buckets of ``run`` when each has an index and a ready time on every
    rank; else [] (a step-guard run, a failed run, a rank that joined early)."""
    buckets = (run.get("sync_last") or {}).get("buckets") or []
    timed = all(b.get("index") is not None and len(b.get("ready_ms") or ()) == run["world_size"]
                for b in buckets)
    return list(buckets) if buckets and timed else []


def _timed_runs(rec: RunRecord) -> dict[str, dict[int, list[dict]]]:
    """variant → world size ≥ 2 → its successful runs with per-bucket times, PER_BUCKET first."""
    out: dict[str, dict[int, list[dict]]] = {}
    for run in (rec.doc.get("strategies") or {}).get("runs", []):
        if "error" not in run and run["world_size"] >= 2 and timed_buckets(run):
            out.setdefault(run["variant"], {}).setdefault(run["world_size"], []).append(run)
    return dict(sorted(out.items(), key=lambda kv: kv[0] != PER_BUCKET))


def bucket_timeline(rec: RunRecord) -> Timeline | None:
    """The step the timeline draws, or None when no run timed its buckets. The variant:
    PER_BUCKET, else the first that has per-bucket times. The size: the largest within the
    host's capacity (a skew measured there is the job's, not the host's), else the smallest.
    The run: the repeat whose worst-bucket skew is the median over repeats (the lower one for
    an even count), so the picture is neither the luckiest nor the unluckiest run."""
    timed = _timed_runs(rec)
    if not timed:
        return None
    variant, by_size = next(iter(timed.items()))
    capacity = rec.environment.capacity
    fitting = [w for w in by_size if w <= capacity]
    w = max(fitting) if fitting else min(by_size)
    ranked = sorted(by_size[w], key=lambda r: (max(b["skew_ms"] for b in timed_buckets(r)),
                                               r["repeat"]))
    run = ranked[(len(ranked) - 1) // 2]
    return Timeline(variant, w, run["repeat"], len(ranked), len(run["step_ms"]) - 1,
                    tuple(timed_buckets(run)), w > capacity)


def timeline_caption(rec: RunRecord) -> str:
    """comparison.md's caption of ``bucket_timeline.png``: what it draws, or why it is absent."""
    t = bucket_timeline(rec)
    if t is None:
        return ("**No bucket timeline (`bucket_timeline.png`): no strategy run in this record "
                f"timed each of its buckets on 2 or more ranks (`{PER_BUCKET}`, the per-bucket "
                f"guard, does); {NOT_PER_BUCKET}.**")
    worst = t.worst
    text = (f"Bucket timeline (`bucket_timeline.png`): when each of the {len(t.buckets)} "
            f"buckets' gradients were ready on each rank in one step of `{t.variant}` on "
            f"{t.world_size} ranks"
            + (" (oversubscribed: the ranks time-share the host)" if t.oversubscribed else "")
            + f": {t.which_step()}; each rank timed from its own step start. The worst bucket, "
            f"{worst['index']}, had a skew of {worst['skew_ms']:.2f} ms (rank "
            f"{worst['late_rank']} last). Runs of harden()'s default, the step guard, are not "
            "drawn: it records one ready time per step, not per bucket.")
    if not t.sized:
        text += " Bucket sizes: not in this record (it predates their recording)."
    return f"**{text}**"
