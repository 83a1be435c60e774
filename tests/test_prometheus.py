"""Per-rank Prometheus exporter and the seed's skew-barrier policy (P2): real HTTP, real ranks."""

from __future__ import annotations

import dataclasses
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from openclaw_ref.arms.config import ArmConfig  # noqa: E402
from openclaw_ref.core.callbacks import Callback, no_metrics  # noqa: E402
from openclaw_ref.core.config import MetricsConfig  # noqa: E402
from openclaw_ref.core.faults import parse_fault  # noqa: E402
from openclaw_ref.core.launch import RankContext  # noqa: E402
from openclaw_ref.core.train import TrainConfig, train_rank  # noqa: E402
from openclaw_ref.ops.prometheus import (  # noqa: E402
    STORE_PORT_KEY,
    PrometheusExporter,
    SkewBarrierPolicy,
    exporter_port,
    metrics_callbacks,
)
from openclaw_ref.sync.base import SyncConfig  # noqa: E402
from openclaw_ref.sync.errors import BadInput, Event  # noqa: E402


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from a live endpoint (text format, no unpickling)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


HARDENED_LIKE = {  # the keys the hardened strategy's step_metrics() reports
    "sync_ms": 3.0, "overflow_elements": 5, "elements": 1000, "overflowed": True, "scale": 4096.0,
    "checks_run": 4, "checks_passed": 4,
    "buckets": [{"index": 0, "skew_ms": 2.0, "late_rank": 1, "ready_ms": [1.0, 3.0]},
                {"index": 1, "skew_ms": 0.5, "late_rank": 0, "ready_ms": [2.5, 2.0]}],
}


@pytest.fixture
def exporter():
    exp = PrometheusExporter(rank=0, port=0)
    yield exp
    exp.close()


def test_exporter_binds_loopback_on_a_free_port_by_default(exporter):
    assert exporter._server.server_address[0] == "127.0.0.1" and exporter.port > 0


def test_exporter_turns_step_metrics_into_series(exporter):
    exporter.on_step_metrics(0, HARDENED_LIKE, applied=False)
    exporter.on_step_metrics(1, HARDENED_LIKE, applied=True,
                        events=[Event("ScaleMismatch", 1, [1])])
    s = scrape(exporter.url)
    assert value(s, "openclaw_steps_total", rank="0") == 2
    assert value(s, "openclaw_skipped_steps_total", rank="0") == 1
    assert value(s, "openclaw_allreduce_seconds_count", rank="0", bucket="all") == 2
    assert value(s, "openclaw_allreduce_seconds_sum", rank="0", bucket="all") == pytest.approx(6e-3)
    assert value(s, "openclaw_bucket_skew_seconds", rank="0", bucket="0") == pytest.approx(2e-3)
    assert value(s, "openclaw_bucket_last_arrivals_total", rank="0", bucket="0",
                 late_rank="1") == 2
    assert value(s, "openclaw_bucket_last_arrivals_total", rank="0", bucket="1",
                 late_rank="0") == 2
    assert value(s, "openclaw_fp16_overflow_elements_total", rank="0") == 10
    assert value(s, "openclaw_overflowed_steps_total", rank="0") == 2
    assert value(s, "openclaw_checks_run_total", rank="0") == 8
    assert value(s, "openclaw_checks_fired_total", rank="0", kind="ScaleMismatch") == 1
    assert value(s, "openclaw_fp16_scale", rank="0") == 4096
    # rank 0 was ready 2 ms before rank 1 at bucket 0, and last at bucket 1 (no wait)
    assert value(s, "openclaw_bucket_wait_seconds_sum", rank="0", bucket="0") == \
        pytest.approx(4e-3)
    assert value(s, "openclaw_bucket_wait_seconds_sum", rank="0", bucket="1") == 0


def test_no_series_carries_a_rank_id_as_its_value(exporter):
    exporter.on_step_metrics(0, HARDENED_LIKE, applied=True)
    names = {name for name, _labels in scrape(exporter.url)}
    assert not any(name.endswith("late_rank") for name in names)


def test_a_step_without_a_pre_scale_exports_no_fp16_scale(exporter):
    native = {k: v for k, v in HARDENED_LIKE.items() if k != "scale"}
    exporter.on_step_metrics(0, native, applied=True)
    assert not any(name == "openclaw_fp16_scale" for name, _ in scrape(exporter.url))


def test_exporter_binds_the_address_it_is_given():
    exp = PrometheusExporter(rank=0, port=0, host="0.0.0.0")
    try:
        assert exp._server.server_address[0] == "0.0.0.0"
        assert value(scrape(f"http://127.0.0.1:{exp.port}/metrics"), "openclaw_steps_total",
                     rank="0") == 0
    finally:
        exp.close()


def test_train_passes_metrics_host_to_the_config():
    from openclaw_ref.cli import build_parser
    from openclaw_ref.cli.train import train_config_from_args

    args = build_parser().parse_args(["train", "--metrics-port", "0",
                                      "--metrics-host", "0.0.0.0"])
    assert train_config_from_args(args).metrics.host == "0.0.0.0"
    args = build_parser().parse_args(["train", "--metrics-port", "0"])
    assert train_config_from_args(args).metrics.host == "127.0.0.1"


def test_an_unresolvable_metrics_host_is_bad_input():
    with pytest.raises(BadInput, match="--metrics-host"):
        MetricsConfig(port=0, host="no such host!")


def test_a_harden_user_exports_from_their_own_loop(tmp_path):
    # the documented API: no openclaw loop, only harden() and on_step_metrics once per step
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from openclaw_ref.sync import harden

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    exp = PrometheusExporter(rank=dist.get_rank(), port=0)
    try:
        ddp = DDP(torch.nn.Linear(4, 2))
        state = harden(ddp, SyncConfig())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            state.begin_step(step)
            ddp(torch.randn(8, 4)).square().mean().backward()
            applied = state.finish_step(step)
            opt.step()
            opt.zero_grad()
            exp.on_step_metrics(step, state.step_metrics(), applied, state.events)
        state.close()
        s = scrape(exp.url)
    finally:
        exp.close()
        dist.destroy_process_group()
    assert value(s, "openclaw_steps_total", rank="0") == 3
    assert value(s, "openclaw_allreduce_seconds_count", rank="0", bucket="all") == 3
    assert value(s, "openclaw_checks_run_total", rank="0") >= 3
    assert not any(name == "openclaw_fp16_scale" for name, _ in s)  # a native wire


def test_each_event_is_counted_once_across_steps(exporter):
    events = [Event("ClockMismatch", 0, [1])]
    exporter.on_step_metrics(0, {}, True, events)
    exporter.on_step_metrics(1, {}, True, events)
    exporter.on_event(Event("ClockMismatch", 2, [1]))
    assert value(scrape(exporter.url), "openclaw_checks_fired_total", rank="0",
                 kind="ClockMismatch") == 2


def test_a_canary_transient_is_counted_by_its_suspect_rank(exporter):
    events = [Event("CanaryTransient", 3, [1]), Event("CanaryTransient", 9, [1])]
    exporter.on_step_metrics(9, {}, True, events)
    s = scrape(exporter.url)
    assert value(s, "openclaw_canary_transients_total", rank="0", suspect="1") == 2
    assert value(s, "openclaw_checks_fired_total", rank="0", kind="CanaryTransient") == 2


def test_two_exporters_in_one_process_do_not_share_state(exporter):
    other = PrometheusExporter(rank=1, port=0)
    try:
        exporter.on_step_metrics(0, {}, True)
        assert value(scrape(other.url), "openclaw_steps_total", rank="1") == 0
        assert value(scrape(other.url), "openclaw_steps_total", rank="0") is None
        assert value(scrape(exporter.url), "openclaw_steps_total", rank="0") == 1
    finally:
        other.close()


def test_close_stops_serving():
    exp = PrometheusExporter(rank=0, port=0)
    url = exp.url
    exp.close()
    exp.close()  # idempotent
    with pytest.raises(OSError):
        scrape(url)


def test_port_is_base_plus_rank_or_zero():
    assert exporter_port(9400, 3) == 9403
    assert exporter_port(0, 3) == 0
    with pytest.raises(BadInput):
        exporter_port(65535, 1)


@pytest.mark.parametrize("kwargs", [{"port": -1}, {"port": 70000}, {"skew_barrier_ms": 0.0}])
def test_metrics_config_rejects_bad_input(kwargs):
    with pytest.raises(BadInput):
        MetricsConfig(**kwargs)


def test_metrics_are_off_by_default():
    assert not MetricsConfig().enabled and not TrainConfig().metrics.enabled


@pytest.mark.parametrize("metrics", [MetricsConfig(port=0), MetricsConfig(skew_barrier_ms=1.5)])
def test_a_run_that_asks_for_metrics_without_a_sink_is_refused(metrics):
    # the loop's default sink (core never imports ops): refusing beats training unobserved
    with pytest.raises(BadInput, match="no metrics sink"):
        no_metrics(metrics, ctx=None)


def test_a_run_without_metrics_needs_no_sink():
    assert no_metrics(MetricsConfig(), ctx=None) == []


@pytest.mark.parametrize("per_rank, fires", [
    ([1.0, 1.0], False), ([1.0, 4.0], False),  # std 1.5 ms: not above the threshold
    ([1.0, 4.2], True), ([0.0, 0.0, 0.0, 8.0], True), ([5.0], False)])
def test_skew_policy_fires_when_std_exceeds_threshold(per_rank, fires):
    assert SkewBarrierPolicy(1.5, len(per_rank)).decide(per_rank) is fires


# --------------------------------------------------------------------------------------------
# Real multi-rank runs (2 gloo ranks from the shared pool)


class ScrapeOwnEndpoint(Callback):
    """A loop callback that scrapes its rank's exporter right after step ``at`` was exported."""

    observes_metrics = True

    def __init__(self, ctx: RankContext, at: int) -> None:
        self.ctx, self.at = ctx, at
        self.samples: dict = {}
        self.port = 0

    def on_step_metrics(self, step, metrics, applied, events=()) -> None:
        if step == self.at:
            self.port = int(self.ctx.store.get(STORE_PORT_KEY.format(rank=self.ctx.rank)))
            self.samples = scrape(f"http://127.0.0.1:{self.port}/metrics")


def train_and_scrape(ctx: RankContext, cfg: TrainConfig, at: int) -> dict:
    scraper = ScrapeOwnEndpoint(ctx, at)
    record = train_rank(ctx, cfg, (scraper,), metrics_callbacks)
    return {"rank": ctx.rank, "port": scraper.port, "samples": scraper.samples, "record": record}


def small_run(sync: str, steps: int = 4, **metrics) -> TrainConfig:
    return TrainConfig(world_size=2, steps=steps, global_batch=8, eval_every=0, progress=False,
                       sync=ArmConfig.of(sync), metrics=MetricsConfig(port=0, **metrics))


def test_every_rank_serves_its_own_endpoint_during_a_ddp_run(pools):
    results = pools.get(2).run(train_and_scrape, small_run("ddp"), 2, timeout_s=120)
    assert results[0]["port"] != results[1]["port"]
    for res in results:
        rank = str(res["rank"])
        assert value(res["samples"], "openclaw_steps_total", rank=rank) == 3  # steps 0..2
        assert value(res["samples"], "openclaw_skipped_steps_total", rank=rank) == 0


def test_hardened_run_exports_allreduce_histogram_and_checks(pools):
    results = pools.get(2).run(train_and_scrape, small_run("hardened"), 2, timeout_s=120)
    for res in results:
        s, rank = res["samples"], str(res["rank"])
        assert value(s, "openclaw_allreduce_seconds_count", rank=rank, bucket="all") == 3
        assert value(s, "openclaw_allreduce_seconds_sum", rank=rank, bucket="all") > 0
        assert value(s, "openclaw_checks_run_total", rank=rank) > 0
        assert any(k[0] == "openclaw_bucket_skew_seconds" for k in s)


def test_skew_barrier_follows_the_in_band_skew_on_every_rank(pools):
    # rank 1 sleeps 60 ms before the backward of step 0: its buckets are ready ~60 ms late, so
    # the seed's 1.5 ms threshold is crossed and step 1 must begin its backward with a barrier.
    # 60, not 20: a first step's one-off costs differ by up to ~13 ms between the ranks here
    # (rank std 3.6 ms seen once with 20 ms), which must not hide the injected lateness.
    cfg = dataclasses.replace(small_run("hardened", skew_barrier_ms=1.5),
                              faults=(parse_fault("late-rank=60ms@1:0"),))
    results = pools.get(2).run(train_and_scrape, cfg, 3, timeout_s=120)
    steps = [s["sync"] for s in results[0]["record"]["steps"]]
    assert steps[0]["skew_source"] == "in-band" and steps[0]["rank_std_ms"] > 5
    assert [s["skew_barrier"] for s in steps[:2]] == [False, True]
    for before, after in zip(steps, steps[1:]):
        assert after["skew_barrier"] is (before["rank_std_ms"] > 1.5)
    barriers = sum(s["skew_barrier"] for s in steps)  # steps 0..3, all before the scrape at 3
    for res in results:
        assert value(res["samples"], "openclaw_skew_barriers_total",
                     rank=str(res["rank"])) == barriers


def policy_agreement(ctx: RankContext, threshold_ms: float) -> list[bool]:
    """Rank-dependent sync times: the rank that would not see a skew alone must still agree."""
    policy = SkewBarrierPolicy(threshold_ms, ctx.world_size)
    armed = []
    for step, local_ms in enumerate([0.5, 9.0 * ctx.rank, 0.5]):
        metrics = {"sync_ms": local_ms}
        policy.on_step_metrics(step, metrics, True)
        armed.append(metrics["skew_barrier_next"])
        policy.before_backward(step + 1)  # the barrier itself must not hang
    return armed + [policy.barriers]


def test_skew_barrier_decision_is_identical_on_every_rank(pools):
    results = pools.get(2).run(policy_agreement, 1.5, timeout_s=60)
    assert results[0] == results[1] == [False, True, False, 1]


def test_skew_policy_uses_in_band_ready_times_without_any_collective():
    # no process group exists in the pytest parent: a collective here would raise
    policy = SkewBarrierPolicy(1.5, world_size=2)
    metrics = dict(HARDENED_LIKE)
    policy.on_step_metrics(0, metrics, True)
    assert metrics["skew_source"] == "in-band"
    assert metrics["rank_std_ms"] == pytest.approx(1.0)  # bucket 0: std of [1, 3]
    assert metrics["skew_barrier_next"] is False
    metrics = {"buckets": [{"index": 0, "ready_ms": [0.0, 4.0]}]}
    policy.on_step_metrics(1, metrics, True)
    assert metrics["skew_barrier_next"] is True


def test_skew_barrier_refuses_a_strategy_without_sync_times():
    with pytest.raises(BadInput, match="sync_ms"):
        SkewBarrierPolicy(1.5, 2).on_step_metrics(0, {}, True)


def test_p2_bench_statistic_is_the_largest_bucket_ready_time_std():
    from openclaw_ref.experiments.p2bench import step_stats

    def step(i, ready, barrier):
        return {"step": i, "step_ms": 10.0 + i, "sync": {
            "sync_ms": 1.0, "skew_barrier": barrier,
            "buckets": [{"index": 0, "ready_ms": ready, "skew_ms": max(ready) - min(ready)},
                        {"index": 1, "ready_ms": [0.0, 0.0], "skew_ms": 0.0}]}}

    record = {"steps": [step(0, [0.0, 8.0], False), step(1, [0.0, 2.0], True),
                        step(2, [1.0, 1.0], True)]}
    stats = step_stats(record, warmup=1)
    assert stats["median_ready_std_ms"] == pytest.approx(0.5)  # steps 1, 2: std 1.0 and 0.0
    assert stats["median_skew_ms"] == pytest.approx(1.0)
    assert stats["barriers"] == 2 and stats["median_step_ms"] == pytest.approx(11.5)


class _RecordingPool:
    """A real rank pool that also records what each ``run`` was given."""

    def __init__(self, pool) -> None:
        self.pool, self.calls = pool, []

    def run(self, fn, *args):
        self.calls.append(args)
        return self.pool.run(fn, *args)


# 8 s of paired training: the slow profile (CI budget)
@pytest.mark.slow
def test_p2_bench_pairs_both_arms_on_one_jitter_draw_and_draws_anew_per_repeat():
    from openclaw_ref.core.launch import LaunchConfig, RankPool
    from openclaw_ref.experiments.p2bench import (
        SEED_JITTER_MS,
        Jitter,
        jitter_seed,
        measure_skew_barrier,
    )

    repeats_seen = []
    with RankPool(LaunchConfig(2, backend="gloo", timeout_s=120)) as real:
        pool = _RecordingPool(real)
        out = measure_skew_barrier(2, steps=5, repeats=2, pool=pool, seed=3,
                                   on_repeat=repeats_seen.append)
    assert repeats_seen == [0, 1]
    assert [len(out["off"]), len(out["on"])] == [2, 2]
    assert all(r["steps"] == 5 for runs in out.values() for r in runs)
    arms = ["on" if cfg.metrics.skew_barrier_ms else "off" for cfg, _, _ in pool.calls]
    assert arms == ["off", "on", "on", "off"]  # the order rotates per repeat
    seeds = [seed for _, _, seed in pool.calls]
    assert seeds == [jitter_seed(3, 0)] * 2 + [jitter_seed(3, 1)] * 2
    draws = [[Jitter(rank, *SEED_JITTER_MS, seed=s).rng.random() for rank in (0, 1)]
             for s in (seeds[0], seeds[2])]
    assert draws[0] != draws[1]  # a new draw per repeat, on every rank
