"""Per-rank Prometheus exporter and the seed's skew-barrier policy (P2), as loop callbacks.

Why callbacks (``core/callbacks.py``): the training loop (``core/train.py``) and the Lightning
strategy call the same hooks, ``before_backward`` and ``on_step_metrics(step, metrics, applied,
events)``, with ``metrics`` = the strategy's ``step_metrics()``. Nothing here knows which
strategy produced them; keys a strategy does not report are simply not exported.

Exporter (``PrometheusExporter``, needs the ``metrics`` extra = prometheus_client):
  * one HTTP endpoint per rank, bound to ``host`` — 127.0.0.1 (loopback) unless asked
    (``MetricsConfig.host``, ``--metrics-host 0.0.0.0`` so a remote Prometheus can scrape a
    multi-node job) — on ``port + rank`` (``port > 0``) or a free port (``port == 0``; the
    chosen port is logged and published in the rendezvous store under
    ``openclaw/metrics/port/<rank>``);
  * usable without our loop: after ``state = harden(ddp)``, call
    ``exporter.on_step_metrics(step, state.step_metrics(), applied, state.events)`` once per
    step (``applied``: ``finish_step``'s verdict, or True without the step protocol);
  * its own ``CollectorRegistry`` — no process-global state, so several exporters (tests, two
    runs in one process) never collide;
  * series (every one carries the exporting ``rank`` as a label; no value is a rank id):
    ``openclaw_allreduce_seconds`` histogram by ``bucket`` (``bucket="all"`` = the whole step's
    sync time), ``openclaw_bucket_skew_seconds`` gauge, ``openclaw_bucket_last_arrivals_total``
    counter by ``bucket`` and ``late_rank`` (how often each rank reached the bucket last),
    ``openclaw_bucket_wait_seconds`` histogram (how long this rank's bucket waited for the last
    rank, from the per-rank ready times), counters ``openclaw_fp16_overflow_elements_total``,
    ``openclaw_overflowed_steps_total``, ``openclaw_skipped_steps_total``,
    ``openclaw_checks_run_total``, ``openclaw_checks_fired_total{kind}``,
    ``openclaw_skew_barriers_total``, ``openclaw_steps_total``; gauge ``openclaw_fp16_scale``
    only on an FP16 wire (a native or bf16 wire has no pre-scale: the series is absent, not 1).
    The seed's ``nccl_allreduce_time_ms`` becomes ``openclaw_allreduce_seconds`` (Prometheus
    base units; "nccl" would be false on gloo).

Skew barrier (``SkewBarrierPolicy``, off by default): after each step, the statistic is the
largest across-rank standard deviation of a bucket's ready time (the hardened control block
carries every rank's ready time, so every rank already holds the same per-rank vector: no extra
collective). Strategies without per-rank ready times fall back to all-gathering each rank's
``sync_ms`` (one ``world_size``-float collective per step). When the statistic exceeds the
threshold (seed: 1.5 ms), every rank runs ``dist.barrier()`` before the *next* backward.
Invariant: the decision is a function of a vector identical on every rank, so every rank takes
the same branch — a barrier on some ranks only would pair with a different collective and hang.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.config import MetricsConfig
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.canary.row import CanaryEvent
from openclaw_ref.sync.errors import BadInput, Event

P2_THRESHOLD_MS = 1.5  # the seed's threshold
STORE_PORT_KEY = "openclaw/metrics/port/{rank}"
# allreduce latency buckets (seconds): 50 µs … ~13 s, factor 2 — spans loopback gloo to stalls
LATENCY_BUCKETS = tuple(5e-5 * 2**i for i in range(19))


def exporter_port(base: int, rank: int) -> int:
    """``base + rank``, or 0 (let the OS choose) when ``base`` is 0."""
    if base == 0:
        return 0
    port = base + rank
    if port > 65535:
        raise BadInput(f"metrics port {base} + rank {rank} exceeds 65535")
    return port


class PrometheusExporter(Callback):
    """One rank's ``/metrics`` endpoint fed from the strategy's per-step metrics."""

    def __init__(self, rank: int, port: int = 0, host: str = "127.0.0.1",
                 store: dist.Store | None = None) -> None:
        try:
            from prometheus_client import (
                CollectorRegistry,
                Counter,
                Gauge,
                Histogram,
                start_http_server,
            )
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise BadInput("--metrics-port needs prometheus_client: "
                           "pip install 'openclaw-sync[metrics]'") from None
        self.rank = rank
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.allreduce_s = Histogram("openclaw_allreduce_seconds",
                                     "Allreduce (sync) time per bucket; bucket=all: whole step",
                                     ["rank", "bucket"], registry=r, buckets=LATENCY_BUCKETS)
        self.skew_s = Gauge("openclaw_bucket_skew_seconds",
                            "Last step's arrival skew of a bucket (latest - earliest rank)",
                            ["rank", "bucket"], registry=r)
        self.last_arrivals = Counter("openclaw_bucket_last_arrivals",
                                     "Steps in which late_rank reached the bucket last",
                                     ["rank", "bucket", "late_rank"], registry=r)
        self.overflow_elements = Counter("openclaw_fp16_overflow_elements",
                                         "Elements that overflowed the fp16 wire",
                                         ["rank"], registry=r)
        self.overflowed_steps = Counter("openclaw_overflowed_steps",
                                        "Steps with at least one overflowed element",
                                        ["rank"], registry=r)
        self.skipped_steps = Counter("openclaw_skipped_steps",
                                     "Optimizer steps skipped by every rank together",
                                     ["rank"], registry=r)
        self.checks_run = Counter("openclaw_checks_run", "In-band consistency checks run",
                                  ["rank"], registry=r)
        self.checks_fired = Counter("openclaw_checks_fired",
                                    "Consistency checks that fired, by kind",
                                    ["rank", "kind"], registry=r)
        self.canary_transients = Counter(
            "openclaw_canary_transients", "One-off probe results the compute canary confirmed "
            "on one rank (CanaryTransient), by the suspect rank", ["rank", "suspect"],
            registry=r)
        self.barriers = Counter("openclaw_skew_barriers",
                                "Barriers inserted by the skew policy (text 000's P2)",
                                ["rank"], registry=r)
        self.steps = Counter("openclaw_steps", "Steps observed", ["rank"], registry=r)
        self.scale = Gauge("openclaw_fp16_scale", "FP16 pre-scale of the last step",
                           ["rank"], registry=r)
        self.rank_std_s = Gauge("openclaw_skew_rank_std_seconds",
                                "P2 statistic of the last step: across-rank std of bucket "
                                "ready times (or of sync times)", ["rank"], registry=r)
        self.wait_s = Histogram("openclaw_bucket_wait_seconds",
                                "Time this rank's bucket was ready before the last rank's "
                                "(a lower bound of its wait inside the allreduce)",
                                ["rank", "bucket"], registry=r, buckets=LATENCY_BUCKETS)
        for metric in (self.overflow_elements, self.overflowed_steps, self.skipped_steps,
                       self.checks_run, self.barriers, self.steps):
            metric.labels(str(rank))  # export zeros from the start: absent != zero to an alert
        self._events_seen = 0
        self._server, self._thread = start_http_server(port, addr=host, registry=r)
        self.host = host
        self.port = int(self._server.server_port)
        # logged where a user sees it: ranks have no logging configuration of their own
        print(f"openclaw-bench: rank {rank} Prometheus metrics at {self.url}", file=sys.stderr,
              flush=True)
        if store is not None:
            store.set(STORE_PORT_KEY.format(rank=rank), str(self.port))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    observes_metrics = True

    def on_step_metrics(self, step: int, metrics: dict, applied: bool,
                        events: Sequence[Event] = ()) -> None:
        rk = str(self.rank)
        self.steps.labels(rk).inc()
        if not applied:
            self.skipped_steps.labels(rk).inc()
        if "sync_ms" in metrics:
            self.allreduce_s.labels(rk, "all").observe(float(metrics["sync_ms"]) / 1e3)
        for b in metrics.get("buckets", ()):
            idx = "step" if b["index"] is None else str(b["index"])  # the step guard: per step
            if b.get("allreduce_ms") is not None:
                self.allreduce_s.labels(rk, idx).observe(float(b["allreduce_ms"]) / 1e3)
            if b.get("skew_ms") is not None:
                self.skew_s.labels(rk, idx).set(float(b["skew_ms"]) / 1e3)
            if b.get("late_rank") is not None:
                self.last_arrivals.labels(rk, idx, str(int(b["late_rank"]))).inc()
            ready = b.get("ready_ms")
            if isinstance(ready, (list, tuple)) and self.rank < len(ready):
                self.wait_s.labels(rk, idx).observe(
                    max(0.0, (max(ready) - ready[self.rank]) / 1e3))
        if metrics.get("overflow_elements"):
            self.overflow_elements.labels(rk).inc(int(metrics["overflow_elements"]))
        if metrics.get("overflowed"):
            self.overflowed_steps.labels(rk).inc()
        if metrics.get("checks_run"):
            self.checks_run.labels(rk).inc(int(metrics["checks_run"]))
        if metrics.get("scale") is not None:
            self.scale.labels(rk).set(float(metrics["scale"]))
        if metrics.get("skew_barrier"):
            self.barriers.labels(rk).inc()
        if metrics.get("rank_std_ms") is not None:
            self.rank_std_s.labels(rk).set(float(metrics["rank_std_ms"]) / 1e3)
        for event in list(events)[self._events_seen:]:
            self.on_event(event)
        self._events_seen = len(events)

    def on_event(self, event: Event) -> None:
        self.checks_fired.labels(str(self.rank), event.kind).inc()
        if event.kind == CanaryEvent.TRANSIENT:
            for suspect in event.ranks:
                self.canary_transients.labels(str(self.rank), str(suspect)).inc()

    def close(self) -> None:
        """Stop serving (idempotent); the port is free again afterwards."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None


class SkewBarrierPolicy(Callback):
    """Seed P2: a barrier before the next backward when the across-rank std of the sync time
    exceeds ``threshold_ms``. Adds one small all-gather per step; see the module docstring for
    why every rank takes the same branch. Marks ``metrics["skew_barrier"]``: whether a barrier
    ran in the step those metrics describe."""

    observes_metrics = True

    def __init__(self, threshold_ms: float, world_size: int,
                 device: torch.device | str = "cpu") -> None:
        self.threshold_ms = threshold_ms
        self.world_size = world_size
        self.device = torch.device(device)
        self._armed = False
        self._ran = False  # a barrier ran in the current step
        self.barriers = 0
        self.last_std_ms: float | None = None

    def before_backward(self, step: int, model: nn.Module | None = None) -> None:
        self._ran = self._armed
        if self._armed:
            dist.barrier()
            self.barriers += 1
            self._armed = False

    def decide(self, per_rank_ms: Sequence[float]) -> bool:
        """Pure: True when the population std of the per-rank times exceeds the threshold."""
        self.last_std_ms = statistics.pstdev(per_rank_ms) if len(per_rank_ms) > 1 else 0.0
        return self.last_std_ms > self.threshold_ms

    def agreed_ready_std_ms(self, metrics: dict) -> float | None:
        """Largest across-rank std of a bucket's ready time, from the per-rank ready times the
        strategy reports (identical on every rank); None when it reports none."""
        vectors = [b["ready_ms"] for b in metrics.get("buckets", ())
                   if isinstance(b.get("ready_ms"), (list, tuple))
                   and len(b["ready_ms"]) == self.world_size]
        if not vectors:
            return None
        return max(statistics.pstdev(map(float, v)) for v in vectors)

    def on_step_metrics(self, step: int, metrics: dict, applied: bool,
                        events: Sequence[Event] = ()) -> None:
        metrics["skew_barrier"] = self._ran
        agreed = self.agreed_ready_std_ms(metrics)
        if agreed is not None:
            self.last_std_ms = agreed
            self._armed = agreed > self.threshold_ms
            metrics["skew_source"] = "in-band"
        elif "sync_ms" in metrics:
            local = torch.tensor([float(metrics["sync_ms"])], dtype=torch.float64,
                                 device=self.device)
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local)
            self._armed = self.decide([float(t) for t in gathered])
            metrics["skew_source"] = "all-gather"
        else:
            # the same strategy runs on every rank, so every rank raises here together
            raise BadInput("--skew-barrier-ms needs a strategy that reports per-rank ready "
                           "times or sync_ms per step (e.g. --sync hardened)")
        metrics["rank_std_ms"] = self.last_std_ms
        metrics["skew_barrier_next"] = self._armed


def metrics_callbacks(cfg: MetricsConfig, ctx: RankInfo) -> list[Callback]:
    """The callbacks a ``MetricsConfig`` asks for on this rank, in the order they must run: the
    policy before the exporter, so the exported step carries the P2 statistic. The loop's
    metrics sink (``core.callbacks.RankCallbacks``): whoever builds a run passes it, e.g.
    ``run_training(cfg, metrics=metrics_callbacks)``."""
    callbacks: list[Callback] = []
    if cfg.skew_barrier_ms is not None and ctx.world_size > 1:
        callbacks.append(SkewBarrierPolicy(cfg.skew_barrier_ms, ctx.world_size, ctx.device))
    if cfg.port is not None:
        callbacks.append(PrometheusExporter(ctx.rank, exporter_port(cfg.port, ctx.rank),
                                            cfg.host, ctx.store))
    return callbacks
