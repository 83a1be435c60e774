"""The regression gate's statistic and decision (``bench.gate.stat``) on synthetic step times: a
cost added to HEAD's every step is read back as that cost, identical code is not flagged, a
noisy host says so; the Student-t quantiles it needs; and the arm orders its job draws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openclaw_ref.bench.gate.job import GateJobConfig, shuffled
from openclaw_ref.bench.gate.stat import (
    SEE,
    TOLERANCE,
    Excess,
    Verdict,
    excess,
    job_median_ms,
    old_rule,
    t_quantile,
    t_two_sided,
    verdict,
)


def jobs_of(added_ms: float, jobs: int = 8, rounds: int = 200, jitter: float = 0.08,
            seed: int = 0, stock_ms: float = 40.0, guard: float = 1.10) -> list[dict]:
    """Step times as a gate job returns them: a drifting host (every arm of a round shares its
    speed), per-step jitter on each arm, stock DDP every 4th round, HEAD paying ``added_ms``
    more than BASE on every step — a fixed cost, as a busy-wait is."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(jobs):
        host = stock_ms * (1 + 0.3 * np.abs(np.sin(rng.uniform(0, 6) + np.arange(rounds) / 50)))
        arm = {name: host * scale * (1 + jitter * rng.standard_normal(rounds))
               for name, scale in (("ddp", 1.0), ("base", guard), ("head", guard))}
        out.append({"ddp": list(arm["ddp"][::4]), "base": list(arm["base"]),
                    "head": list(arm["head"] + added_ms)})
    return out


def test_a_fixed_cost_added_to_every_step_moves_a_jobs_median_by_exactly_that():
    rng = np.random.default_rng(1)
    base = rng.gamma(4.0, 6.0, 500)
    head = base[rng.permutation(500)]  # identical code: the same distribution
    assert job_median_ms(head + 0.5, base) == pytest.approx(job_median_ms(head, base) + 0.5)
    with pytest.raises(ValueError):
        job_median_ms([1.0], [1.0, 2.0])


def test_the_median_of_ratios_reads_a_fixed_cost_as_something_else():
    """Why the gate no longer reads a median of per-round ``(head − base) ÷ stock`` back in µs:
    with stock steps that vary from round to round, 500 µs added reads otherwise; the median
    of the differences reads 500."""
    rng = np.random.default_rng(2)
    stock = np.where(rng.random(4000) < 0.3, 48.0, 24.0) * (1 + 0.02 * rng.standard_normal(4000))
    base, head = (stock * 1.1 + rng.normal(0, 2.0, 4000) for _ in range(2))
    ratio_read = np.median((head + 0.5 - base) / stock) - np.median((head - base) / stock)
    assert abs(ratio_read * np.median(stock) - 0.5) > 0.05
    assert np.median(head + 0.5 - base) - np.median(head - base) == pytest.approx(0.5, abs=0.05)


def test_a_slowdown_of_five_percent_of_a_stock_step_is_read_back_and_flagged():
    x = excess(jobs_of(SEE * 40.0))
    assert x.low_ms < 2.0 < x.high_ms and abs(x.point - SEE) < 0.01
    assert verdict(x) is Verdict.SLOWER and Verdict.SLOWER.exit_code == 1


def test_identical_code_is_not_flagged_and_the_interval_rules_out_five_percent():
    for seed in range(3):
        x = excess(jobs_of(0.0, seed=seed))
        assert x.low < 0 < x.high and x.high < SEE
        assert verdict(x) is Verdict.WITHIN and Verdict.WITHIN.exit_code == 0


def test_a_host_too_noisy_to_see_five_percent_says_noisy_not_within():
    x = excess(jobs_of(0.0, jobs=2, rounds=30, jitter=0.4))
    assert x.high >= SEE and verdict(x) is Verdict.NOISY and Verdict.NOISY.exit_code == 5


def test_the_excess_is_read_in_the_median_stock_step():
    jobs = [{"ddp": [40.0, 40.0, 80.0], "base": [50.0, 51.0], "head": [52.0, 53.0]},
            {"ddp": [40.0], "base": [50.0, 50.0], "head": [51.0, 51.0]}]
    x = excess(jobs)
    assert (x.ms, x.stock_ms, x.jobs, x.rounds) == (1.5, 40.0, 2, 4)
    assert x.point == pytest.approx(1.5 / 40.0) and x.to_json()["us"] == pytest.approx(1500.0)


def interval(point: float, low: float, high: float) -> Excess:
    return Excess(point * 40, low * 40, high * 40, 40.0, 4, 800, 0.95)


def test_the_verdict_rule_at_its_edges():
    assert verdict(interval(TOLERANCE, 0.001, 0.04)) is Verdict.SLOWER
    assert verdict(interval(TOLERANCE, 0.0, 0.04)) is Verdict.WITHIN  # not above 0
    assert verdict(interval(TOLERANCE - 1e-9, 0.02, 0.04)) is Verdict.WITHIN
    assert verdict(interval(0.0, -0.03, SEE)) is Verdict.NOISY
    assert verdict(interval(0.2, -0.01, 0.4)) is Verdict.NOISY  # big, not sure


@pytest.mark.parametrize("df,p,table", [(1, 0.975, 12.7062), (3, 0.975, 3.1824),
                                        (4, 0.995, 4.6041), (13, 0.975, 2.1604),
                                        (13, 0.9975, 3.3725), (30, 0.975, 2.0423)])
def test_student_t_quantiles_match_the_printed_tables(df, p, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 4.0), st.integers(1, 40))
def test_the_t_distribution_function_rises_from_0_to_1(t, df):
    assert 0.0 < t_two_sided(t, df) < 1.0
    assert t_two_sided(t, df) < t_two_sided(t * 1.5, df)
    assert t_two_sided(t, df + 1) > t_two_sided(t, df)  # heavier tails at fewer df
    assert t_quantile(0.5 + t_two_sided(t, df) / 2, df) == pytest.approx(t, rel=1e-6)


def test_the_old_factor_rule_misses_five_percent_of_a_stock_step_even_without_noise():
    """hardened ÷ ddp 1.10 → 1.15 is a factor 1.045: under 1.05, so the asv gate could not
    see the slowdown this gate must see, however quiet the host."""
    quiet = jobs_of(SEE * 40.0, jitter=0.0)
    rule = old_rule(quiet)
    assert rule["base_over_ddp"] == pytest.approx(1.10, abs=0.01) and not rule["flagged"]
    assert verdict(excess(quiet)) is Verdict.SLOWER
    assert old_rule(jobs_of(0.12 * 40.0, jitter=0.0))["flagged"]


def test_drawn_arm_orders_are_permutations_the_same_on_every_rank():
    arms = ("ddp", "base", "head")
    a, b = shuffled(arms, 3), shuffled(arms, 3)
    orders = [a(s) for s in range(600)]
    assert orders == [b(s) for s in range(600)] and all(sorted(o) == sorted(arms) for o in orders)
    behind = {(p, q): 0 for p in arms for q in arms if p != q}
    flat = [arm for o in orders for arm in o]
    for p, q in zip(flat, flat[1:]):
        if p != q:
            behind[p, q] += 1
    assert max(behind.values()) < 1.25 * min(behind.values())  # each arm behind each alike


def test_stock_ddp_takes_a_turn_in_every_warm_up_round_then_every_fourth():
    cfg = GateJobConfig(sides=(("base", "r", "m"), ("head", "r", "m")), rounds=12, warmup=3)
    order = shuffled(cfg.arms, 0, lambda step, arm: arm != "ddp" or cfg.with_stock(step))
    with_stock = [step for step in range(15) if "ddp" in order(step)]
    assert with_stock == [0, 1, 2, 3, 7, 11]
    assert all({"base", "head"} <= set(order(step)) for step in range(15))
