"""The bucket timeline: drawn from the run that times every bucket, or not drawn, and said so."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from openclaw_ref.reporting.comparison import comparison_markdown  # noqa: E402
from openclaw_ref.reporting.plots import bucket_timeline_figure, render_plots  # noqa: E402
from openclaw_ref.reporting.record import RunRecord, load_record, parse_record  # noqa: E402
from openclaw_ref.reporting.timeline import (  # noqa: E402
    PER_BUCKET,
    bucket_timeline,
    timed_buckets,
    timeline_caption,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "cpu2-gloo" / "raw.json"


@pytest.fixture(scope="module")
def published() -> dict:
    return json.loads(PUBLISHED.read_text())


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    from matplotlib import pyplot as plt

    plt.close("all")


def edited(doc: dict, keep=lambda run: True, cores: int | None = None) -> RunRecord:
    """The published record with only the strategy runs ``keep`` accepts (and ``cores``)."""
    doc = copy.deepcopy(doc)
    doc["strategies"]["runs"] = [r for r in doc["strategies"]["runs"] if keep(r)]
    if cores is not None:
        doc["meta"]["environment"]["cpu_count"] = cores
    return parse_record(doc)


def step_guard_only(run: dict) -> bool:
    """Runs whose last step holds no per-bucket times (stock DDP, harden()'s step guard)."""
    return not timed_buckets(run)


def assert_draws_every_bucket_on_every_rank(rec: RunRecord) -> None:
    """What a reader of the plot needs: ≥ 2 buckets, each named by its index, on every rank."""
    t = bucket_timeline(rec)
    assert t is not None and len(t.buckets) >= 2
    fig = bucket_timeline_figure(rec)
    ax = fig.axes[0]
    labels = [x.get_text() for x in ax.get_legend().get_texts()]
    assert labels == [f"bucket {b['index']}" + (f": {b['elements']:,} elements" if t.sized
                                                  else "") for b in t.buckets]
    assert not any("None" in label for label in labels)
    assert [len(c.get_offsets()) for c in ax.collections] == [t.world_size] * len(t.buckets)
    assert t.variant in ax.get_title() and f"step ({t.step})" in ax.get_title()


def test_the_published_timeline_draws_each_bucket_of_the_per_bucket_guard_on_each_rank(
        published):
    rec = parse_record(copy.deepcopy(published))
    assert_draws_every_bucket_on_every_rank(rec)
    assert bucket_timeline(rec).variant == PER_BUCKET


def test_the_step_guards_one_ready_time_per_step_is_never_drawn_as_a_bucket(published):
    rec = edited(published, step_guard_only)
    assert any(r["variant"] == "hardened fp32" for r in rec.doc["strategies"]["runs"])
    assert bucket_timeline(rec) is None and bucket_timeline_figure(rec) is None


def test_a_record_without_per_bucket_times_says_so_and_leaves_no_stale_plot(published,
                                                                            tmp_path):
    rec = edited(published, step_guard_only)
    (tmp_path / "bucket_timeline.png").write_bytes(b"a plot of an older record")
    made = render_plots(rec, tmp_path)
    assert "bucket_timeline.png" not in [p.name for p in made]
    assert not (tmp_path / "bucket_timeline.png").exists()
    caption = timeline_caption(rec)
    assert caption.startswith("**No bucket timeline") and PER_BUCKET in caption
    assert caption in comparison_markdown(rec)


def test_the_caption_names_the_step_and_the_worst_skew_the_plot_marks(published):
    rec = parse_record(copy.deepcopy(published))
    t = bucket_timeline(rec)
    worst = max(t.buckets, key=lambda b: b["skew_ms"])
    caption = timeline_caption(rec)
    assert caption in comparison_markdown(rec)
    assert f"`{PER_BUCKET}` on {t.world_size} ranks" in caption
    assert f"{worst['skew_ms']:.2f} ms (rank {worst['late_rank']} last)" in caption
    texts = [x.get_text() for x in bucket_timeline_figure(rec).axes[0].texts]
    assert any(f"skew {worst['skew_ms']:.2f} ms" in x for x in texts)


def test_the_drawn_run_is_the_repeat_with_the_median_worst_bucket_skew(published):
    rec = parse_record(copy.deepcopy(published))
    t = bucket_timeline(rec)
    worst = sorted(max(b["skew_ms"] for b in timed_buckets(r))
                   for r in rec.doc["strategies"]["runs"]
                   if r["variant"] == PER_BUCKET and r["world_size"] == t.world_size)
    assert t.repeats == len(worst) == 5 and t.worst["skew_ms"] == worst[2]


def test_of_an_even_number_of_repeats_the_lower_median_is_drawn_and_said(published):
    rec = edited(published, lambda r: r["repeat"] < 4)
    t = bucket_timeline(rec)
    worst = sorted(max(b["skew_ms"] for b in timed_buckets(r))
                   for r in rec.doc["strategies"]["runs"]
                   if r["variant"] == PER_BUCKET and r["world_size"] == t.world_size)
    assert t.repeats == 4 and t.worst["skew_ms"] == worst[1]
    assert "lower median worst-bucket skew of 4" in timeline_caption(rec)


def test_the_drawn_size_is_the_largest_that_fits_the_hosts_cores(published):
    assert bucket_timeline(edited(published, cores=2)).world_size == 2
    four = bucket_timeline(edited(published, cores=4))
    assert four.world_size == 4 and not four.oversubscribed
    one = bucket_timeline(edited(published, cores=1))
    assert one.world_size == 2 and one.oversubscribed and "oversubscribed" in \
        timeline_caption(edited(published, cores=1))


def test_without_the_per_bucket_guards_row_another_row_that_times_buckets_is_drawn(published):
    rec = edited(published, lambda r: r["variant"] != PER_BUCKET)
    t = bucket_timeline(rec)
    assert t is not None and t.variant != PER_BUCKET
    assert f"`{t.variant}`" in timeline_caption(rec)


def test_bucket_sizes_are_in_the_legend_when_the_record_holds_them(published):
    doc = copy.deepcopy(published)
    for r in doc["strategies"]["runs"]:
        for i, b in enumerate(timed_buckets(r)):
            b["elements"] = 1000 + i
    rec = parse_record(doc)
    assert_draws_every_bucket_on_every_rank(rec)
    labels = [x.get_text() for x in bucket_timeline_figure(rec).axes[0].get_legend().get_texts()]
    assert labels[0] == "bucket 0: 1,000 elements"
    assert "sizes: not in this record" not in timeline_caption(rec)


def test_a_record_without_bucket_sizes_says_so_in_the_caption(published):
    doc = copy.deepcopy(published)
    for r in doc["strategies"]["runs"]:
        for b in timed_buckets(r):
            b.pop("elements", None)
    assert "sizes: not in this record" in timeline_caption(parse_record(doc))


def test_the_published_timeline_names_its_bucket_sizes():
    assert "sizes: not in this record" not in timeline_caption(load_record(PUBLISHED))
