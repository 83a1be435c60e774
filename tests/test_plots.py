"""The plots: what each must let a reader judge (see ``reporting/plots.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from openclaw_ref.reporting.plots import (  # noqa: E402
    PLOTS,
    distinct_styles,
    qualitative_styles,
    quick_banner,
    render_plots,
    scaling_points,
    stopped_sizes,
)
from openclaw_ref.reporting.record import load_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", [1, 10, 15, 40])
def test_every_bucket_gets_its_own_colour(n):
    colours = [c for c, _marker in distinct_styles(n)]
    assert len(set(colours)) == n


@pytest.mark.parametrize("n", [1, 7, 10, 12])
def test_every_strategy_gets_its_own_colour_and_up_to_ten_a_palette_of_distinct_hues(n):
    styles = qualitative_styles(n)
    assert len({c for c, _ in styles}) == n and len({m for _, m in styles}) == min(n, 10)


def test_a_strategy_stopped_at_a_size_is_named_with_what_stopped_it():
    def run(w, repeat, **kw):
        return {"variant": "norm-ema", "world_size": w, "repeat": repeat, **kw}

    stop = {"kind": "BucketMisalignment", "step": 0, "ranks": [1]}
    raw = {"strategies": {"runs": [
        run(1, 0, step_ms=[1.0] * 5), run(2, 0, error="x", stopped_by=stop),
        run(2, 1, error="x", stopped_by=stop), run(4, 0, error="RankFailed: rank 3 died"),
        run(4, 1, step_ms=[1.0] * 5)]}}  # one repeat finished at 4 ranks: not stopped there
    assert stopped_sizes(raw) == {"norm-ema": [(2, "BucketMisalignment")]}


def test_scaling_points_are_the_median_and_range_over_repeats_per_world_size():
    def run(w, repeat, step):
        return {"variant": "ddp", "world_size": w, "repeat": repeat,
                "step_ms": [999.0, 999.0, step, step, step]}  # 2 warm-up steps excluded

    raw = {"strategies": {"runs": [run(1, 0, 10.0), run(1, 1, 30.0), run(1, 2, 20.0),
                                   run(2, 0, 40.0), {"variant": "ddp", "world_size": 4,
                                                     "repeat": 0, "error": "crash"}]}}
    assert scaling_points(raw) == {"ddp": [(1, 20.0, 10.0, 30.0), (2, 40.0, 40.0, 40.0)]}


def test_the_committed_record_renders_every_plot(tmp_path):
    rec = load_record(ROOT / "results" / "cpu2-gloo" / "raw.json")
    made = render_plots(rec, tmp_path)
    assert sorted(p.name for p in made) == ["bucket_timeline.png", "loss_curves.png",
                                           "overflow_vs_scale.png", "step_times.png"]
    assert all(p.stat().st_size > 10_000 for p in made)


@pytest.mark.parametrize("name, build", PLOTS, ids=[name for name, _ in PLOTS])
def test_the_quick_banner_sits_above_every_title_label_and_legend_of_each_plot(name, build):
    from matplotlib import pyplot as plt

    fig = build(load_record(ROOT / "results" / "cpu2-gloo" / "raw.json"))
    try:
        renderer = fig.canvas.get_renderer()
        drawn = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # all but the banner
        named = [a.get_window_extent(renderer) for ax in fig.axes
                 for a in (ax.title, ax.xaxis.label, ax.yaxis.label, ax.get_legend()) if a]
        banner = quick_banner(fig)
        fig.draw(renderer)
        box = banner.get_window_extent(renderer)
        assert box.y0 > drawn.y1 and all(box.y0 > n.y1 for n in named)
        assert fig.get_tightbbox(renderer).y1 * fig.dpi >= box.y1 - 1  # inside the saved crop
    finally:
        plt.close(fig)
