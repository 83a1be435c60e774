"""What a comm hook costs per step and per bucket, with every arm interleaved in ONE job.

Every arm here is a DDP model wrapping an identical copy of the same network, all on the same
ranks and process group, and the arms take turns step by step (``experiments.interleave``:
why, and the paired ratio every figure is). The FSDP2 arms (stock ``fully_shard`` and
``harden()`` on it) are ``experiments.fsdp_cost``, on the same helpers and the same MLP.

Arms:
  ``ddp``                 stock DDP, its built-in C++ allreduce (the denominator)
  ``floor``               stock DDP plus one bare exchange of the step guard's bytes per step,
                          nothing checked (``exchange_floor``): what any guard that reads a
                          per-step verdict before the optimizer must pay
  ``floor+nancheck``      the floor plus the guard's local non-finite pass (each gradient
                          summed as it is accumulated, the flag read before the exchange):
                          what a guard that names a rank's NaN cannot avoid
  ``allreduce_hook``      PyTorch's Python ``default_hooks.allreduce_hook``
  ``fp16_compress_hook``  PyTorch's ``default_hooks.fp16_compress_hook``
  ``hardened``            ``harden()`` with its defaults: the step guard (DDP's own C++
                          reduction, one small exchange per step)
  ``hardened-fp16``       the step guard on DDP's built-in fp16 wire
  ``hardened-noreplica``  ``hardened`` without the replica digest (``replica_slices=0``): what
                          the default digest costs
  ``hardened-bucket-fp32``  the per-bucket guard (the forensic mode: a Python comm hook that
                          checks every bucket), fp32 wire
  ``hardened+canary``     ``hardened`` with the compute canary probing every step (what one
                          probe step costs; the tables amortize it over ``CANARY_EVERY``, the
                          default K — ``hardened`` itself probes at step 1, inside the
                          warm-up, and next at step 257: none in the timed window). Every
                          hardened arm reports the most gradient bytes a probe held

Models: ``mlp`` — 8 × ``Linear(512, 512)`` (2.1 M parameters) with a 1 MB bucket cap, about
nine buckets, nothing of openclaw; or an openclaw preset (``tiny``: a 0.025 MB cap gives 15
buckets; ``small``: 5.4 M parameters, a 1 MB cap). The per-bucket host cost of a hook is
(its median step − ddp's) ÷ buckets.

Run alone: ``openclaw-bench hook-cost --world-size 2 --steps 150``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.core.metrics import median_paired_ratio
from openclaw_ref.experiments.exchange_floor import ExchangeFloor
from openclaw_ref.experiments.interleave import interleaved_times, paired_figures, slowest_rank
from openclaw_ref.sync.base import CANARY_EVERY
from openclaw_ref.sync.errors import BadInput

ARMS = ("ddp", "floor", "floor+nancheck", "allreduce_hook", "fp16_compress_hook", "hardened",
        "hardened-fp16", "hardened-noreplica", "hardened-bucket-fp32", "hardened+canary")
BASELINE = "ddp"
# each hardened arm's SyncConfig beyond the defaults
HARDENED_ARMS: dict[str, dict] = {"hardened": {}, "hardened-fp16": {"wire": "fp16"},
                                  "hardened-noreplica": {"replica_slices": 0},
                                  "hardened-bucket-fp32": {"guard": "bucket", "wire": "fp32"},
                                  # a probe every step: what one probe step costs (a cost paid once
                                  # every K steps is invisible to a median of per-step ratios);
                                  # the renderer amortizes it over CANARY_EVERY
                                  "hardened+canary": {"canary_every": 1}}
# (arm, over): the ratios between two arms each job reports beside every arm's ratio to ddp,
# where both arms ran — each hardened arm beside PyTorch's Python hook of the same wire, the
# default guard beside the floor (what its checks cost above the one collective), and any
# variant beside the arm it extends
RATIO_PAIRS: tuple[tuple[str, str], ...] = (
    ("hardened", "floor"), ("hardened", "allreduce_hook"),
    ("floor+nancheck", "floor"), ("hardened-noreplica", "floor+nancheck"),
    ("hardened", "hardened-noreplica"),
    ("hardened+canary", "hardened"),
    ("hardened-fp16", "fp16_compress_hook"), ("hardened-noreplica", "allreduce_hook"),
    ("hardened-bucket-fp32", "allreduce_hook"))
MLP_WIDTH, MLP_LAYERS, MLP_BATCH = 512, 8, 32
BUCKET_CAP_MB = {"mlp": 1.0, "tiny": 0.025, "small": 1.0}


@dataclass(frozen=True)
class HookCostConfig:
    model: str = "mlp"  # "mlp", or an openclaw preset name
    world_size: int = 2
    steps: int = 150  # timed steps per arm
    warmup: int = 10  # untimed steps per arm (DDP rebuilds its buckets after the first)
    arms: tuple[str, ...] = ARMS
    bucket_cap_mb: float | None = None  # None: the model's default in BUCKET_CAP_MB
    seed: int = 0

    def __post_init__(self) -> None:
        from openclaw_ref.core.model import PRESETS

        if self.model != "mlp" and self.model not in PRESETS:
            raise BadInput(f"model must be mlp or a preset ({', '.join(PRESETS)}); "
                           f"got {self.model!r}")
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or BASELINE not in self.arms:
            raise BadInput(f"arms must include {BASELINE} and come from {', '.join(ARMS)}; "
                           f"got {list(self.arms)}")
        if self.world_size < 2:
            raise BadInput("a hook's cost needs at least 2 ranks (nothing crosses a wire at 1)")
        if self.steps < 5 or self.warmup < 2:
            raise BadInput("need at least 5 timed and 2 warm-up steps per arm")

    @property
    def cap_mb(self) -> float:
        return self.bucket_cap_mb or BUCKET_CAP_MB.get(self.model, 25.0)


def plain_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(MLP_LAYERS):
        layers += [nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def mlp_loss(seed: int, ctx: RankContext, data_rank: int | None = None
             ) -> Callable[[nn.Module, int], torch.Tensor]:
    """``loss(model, step)`` of the MLP: a batch per step and ``data_rank`` (default this
    rank; under tensor parallelism its dp rank, so the tp ranks of a dp group see the same
    batch), the same for every arm (and every job of the same seed)."""
    data_rank = ctx.rank if data_rank is None else data_rank

    def loss(model: nn.Module, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + data_rank)
        x = torch.randn(MLP_BATCH, MLP_WIDTH, generator=g).to(ctx.device)
        return F.mse_loss(model(x), x)

    return loss


def wrap_arm(arm: str, model: nn.Module, ctx: RankContext, cap_mb: float, find_unused: bool,
             as_view: bool = False):
    """(DDP model, what the arm adds to it — a hardened state, the floor's exchange — or None)
    of one arm."""
    from openclaw_ref.sync.base import SyncConfig
    from openclaw_ref.sync.hardening import harden

    ddp = DDP(model, bucket_cap_mb=cap_mb, find_unused_parameters=find_unused,
              gradient_as_bucket_view=as_view,
              device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if arm == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif arm == "fp16_compress_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif arm in ("floor", "floor+nancheck"):
        return ddp, ExchangeFloor(ddp, nancheck=arm == "floor+nancheck")
    elif arm in HARDENED_ARMS:
        return ddp, harden(ddp, SyncConfig(**HARDENED_ARMS[arm]), ctx)
    return ddp, None


def step_fn(model: str, seed: int, ctx: RankContext) -> tuple[nn.Module, Callable]:
    """The network ``model`` (``mlp`` or a preset) and ``loss(model, step)``: rank-dependent
    inputs, identical for every arm (and for the canary's reproducibility job)."""
    if model == "mlp":
        return plain_mlp(seed).to(ctx.device), mlp_loss(seed, ctx)
    from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
    from openclaw_ref.core.model import build_model, preset

    model_cfg = preset(model, seed=seed)
    ds = SkillDataset(model_cfg, DataConfig(seed=seed))
    net = build_model(model_cfg).to(ctx.device)

    def loss(model: nn.Module, step: int) -> torch.Tensor:
        b = rank_batch(ds, step, 8 * ctx.world_size, ctx.rank, ctx.world_size).to(ctx.device)
        return F.cross_entropy(model(b.tokens, b.sample_ids, step), b.labels)

    return net, loss


def bucket_count(ddp: DDP) -> int:
    """Buckets of the layout DDP uses now (rebuilt after the first iteration when it can)."""
    data = ddp._get_ddp_logging_data()
    raw = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", ""))
    return len([x for x in raw.split(",") if x.strip()])


def arm_step(ddp: DDP, state, opt: torch.optim.Optimizer,
             loss: Callable[[nn.Module, int], torch.Tensor]) -> Callable[[int], None]:
    """``step(i)`` of one arm: forward and backward of ``loss``, the optimizer step unless the
    guard's verdict refuses it, ``zero_grad``."""
    def step(i: int) -> None:
        loss(ddp, i).backward()
        if state is None or state.finish_step():
            opt.step()
        opt.zero_grad(set_to_none=False)
    return step


def hook_cost_rank(ctx: RankContext, cfg: HookCostConfig) -> dict | None:
    """Rank task: every arm's step times (ms, slowest rank per step), interleaved."""
    net, loss = step_fn(cfg.model, cfg.seed, ctx)
    arms = {}
    for arm in cfg.arms:
        ddp, state = wrap_arm(arm, copy.deepcopy(net), ctx, cfg.cap_mb, cfg.model != "mlp")
        arms[arm] = (ddp, state, torch.optim.SGD(ddp.parameters(), lr=1e-3))

    try:
        times = interleaved_times({arm: arm_step(*arms[arm], loss) for arm in cfg.arms}, cfg.arms,
                                  cfg.warmup, cfg.steps, ctx.device)
        buckets = {arm: bucket_count(arms[arm][0]) for arm in cfg.arms}
        false_alarms = sum(len(s.events) for _, s, _ in arms.values() if s is not None)
        held = {arm: s.canary.held_bytes for arm, (_, s, _) in arms.items()
                if getattr(s, "canary", None) is not None}
    finally:
        for _, state, _ in arms.values():
            if state is not None:
                state.close()
    slowest = slowest_rank(times, cfg.arms)
    if not ctx.is_main:
        return None
    return {"arms": list(cfg.arms), "step_ms": slowest, "buckets": buckets,
            "events": false_alarms, "probe_held_bytes": held}


MEMORY_ARMS = ("ddp", "fp16_compress_hook", "hardened", "hardened-fp16",
               "hardened-bucket-fp32")


def hook_memory_rank(ctx: RankContext, seed: int = 0, warmup: int = 2,
                     steps: int = 3) -> list[dict] | None:
    """Rank task: per arm × ``gradient_as_bucket_view``, on a fresh copy of the MLP, (1) the
    bytes the hook holds between steps (its wire buffers, counted from the live tensors) and
    (2) the peak memory growth within steady-state steps, after DDP's bucket rebuild: the
    peak window (VmHWM on CPU, the allocator's peak on CUDA — ``metrics.reset_peak_memory``)
    opens after ``warmup`` steps, so it sees the step's transient allocations on top of what
    the run already holds."""
    import gc

    from openclaw_ref.core.metrics import peak_memory_mb, reset_peak_memory

    rows = []
    configs = [(a, v) for v in (False, True) for a in MEMORY_ARMS]
    for arm, as_view in configs:
        gc.collect()
        ddp, state = wrap_arm(arm, plain_mlp(seed).to(ctx.device), ctx, BUCKET_CAP_MB["mlp"],
                              False, as_view)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed + ctx.rank)
        scope, start = "process", 0.0
        for step in range(warmup + steps):
            if step == warmup:
                scope = reset_peak_memory(ctx.device)
                start = peak_memory_mb(ctx.device, scope)
            x = torch.randn(MLP_BATCH, MLP_WIDTH, generator=g).to(ctx.device)
            F.mse_loss(ddp(x), x).backward()
            if state is None or state.finish_step():
                opt.step()
            opt.zero_grad(set_to_none=False)
        grad_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters())
        held = state.held_bytes() if state else 0
        rows.append({"arm": arm, "gradient_as_bucket_view": as_view,
                     "step_peak_growth_mb": peak_memory_mb(ctx.device, scope) - start,
                     "scope": scope, "gradient_mb": grad_bytes / 2**20,
                     "hook_held_mb": held / 2**20})
        if state is not None:
            state.close()
        del ddp, state, opt
    return rows if ctx.is_main else None


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"


def run_memory(world_size: int = 2, steps: int = 3) -> list[dict]:
    """``hook_memory_rank`` (``steps`` steady-state steps per arm) on fresh ranks whose glibc
    maps every block ≥ 64 KiB on its own (a fixed ``MALLOC_MMAP_THRESHOLD_``), so a freed
    tensor leaves the resident set at once and the high-water mark counts live tensor bytes,
    not heap fragmentation: repeat runs agree to ±0.3 MiB, where the default allocator's moved
    by ±10 MiB with the arm order."""
    launch = LaunchConfig(world_size=world_size, backend="gloo", threads_per_rank=1)
    previous = os.environ.get(MMAP_THRESHOLD_ENV)
    os.environ[MMAP_THRESHOLD_ENV] = "65536"  # read by each rank's libc at start
    try:
        pool = RankPool(launch)
    finally:
        if previous is None:
            del os.environ[MMAP_THRESHOLD_ENV]
        else:
            os.environ[MMAP_THRESHOLD_ENV] = previous
    with pool:
        return pool.run(hook_memory_rank, 0, 2, steps)[0]


def summarize(raw: dict) -> dict:
    """Per arm: median step, the median per-step ratio to ddp with its 95 % interval, and the
    host cost per bucket beyond ddp's (µs, from the ratio and its interval)."""
    step_ms = raw["step_ms"]
    base = step_ms[BASELINE]
    base_median = statistics.median(base)
    out = {}
    for arm in raw["arms"]:
        figures = paired_figures(step_ms[arm], base)
        buckets = raw["buckets"][arm]
        per_bucket = [(figures[k] - 1) * base_median * 1e3 / buckets
                      for k in ("ratio", "ratio_low", "ratio_high")]
        out[arm] = {**figures, "buckets": buckets, "per_bucket_us": per_bucket[0],
                    "per_bucket_us_low": per_bucket[1], "per_bucket_us_high": per_bucket[2],
                    "probe_held_bytes": raw.get("probe_held_bytes", {}).get(arm)}
    return out


def pair_name(arm: str, over: str) -> str:
    """One pair's name where pairs are keyed (the asv figures): ``arm/over``."""
    return f"{arm}/{over}"


def pair_ratios(raw: dict) -> list[dict]:
    """Each of ``RATIO_PAIRS`` whose two arms ran in this job, in that order: the median of
    the per-step ratios of ``arm`` to ``over`` with its 95 % interval."""
    step_ms = raw["step_ms"]
    out = []
    for arm, over in RATIO_PAIRS:
        if arm in step_ms and over in step_ms:
            r = median_paired_ratio(step_ms[arm], step_ms[over])
            pair = {"arm": arm, "over": over, "ratio": r.point, "ratio_low": r.low,
                    "ratio_high": r.high}
            every = HARDENED_ARMS.get(arm, {}).get("canary_every")
            if every:  # a probe every `every` steps; the renderer amortizes it over K
                pair.update(probe_every=every, amortize_over=CANARY_EVERY)
            out.append(pair)
    return out


def run(cfg: HookCostConfig, threads_per_rank: int = 1) -> dict:
    """One job: every arm interleaved on ``cfg.world_size`` fresh ranks; raw times, summary and
    the ratios between arms."""
    launch = LaunchConfig(world_size=cfg.world_size, backend="gloo",
                          threads_per_rank=threads_per_rank)
    with RankPool(launch) as pool:
        raw = pool.run(hook_cost_rank, cfg)[0]
    return {"config": dataclasses.asdict(cfg), "raw": raw, "summary": summarize(raw),
            "pairs": pair_ratios(raw)}
