"""The compute canary on ranks that really differ: one rank runs 1 torch thread, another 2. On
this CPU a LayerNorm's backward reduces its weight gradient in another order with 2 threads,
so healthy ranks' probes differ in the last bits; the fingerprints exchanged before the first
probe must show that, say so (``CanaryUnreproducible``, naming the rank and "threads"), start
the canary on its tolerance, and then raise no alarm — while an exponent flip on a faulty rank
is still named (``canary``, ``canary.fingerprint``, ``canary.tolerance``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.sdc_faults import FaultyMatmul, entered, sdc_model
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.canary.probe import run_probe
from openclaw_ref.sync.canary.row import CanaryEvent
from openclaw_ref.sync.canary.tolerance import RTOL, distance
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

FEATURES, WIDTH, CLASSES, BATCH = 16, 64, 4, 8


class LayerNormNet(nn.Module):
    """Linear, LayerNorm, Linear: the LayerNorm's gradient is where thread counts show."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.norm(self.inp(x))))


@dataclass(frozen=True)
class HeteroRun:
    """``threads[r]``: rank r's torch threads; the canary every ``canary_every`` steps (0:
    off); ``fault`` (an SDC injector, with ``value``) on ``fault_rank`` from ``fault_step``."""

    threads: tuple[int, ...] = (1, 2)
    steps: int = 10
    canary_every: int = 1
    fault: str = ""
    value: str = ""
    fault_rank: int = 0
    fault_step: int = 4


def hetero_task(ctx, run: HeteroRun) -> dict:
    """A plain hardened DDP loop with this rank's thread count (the pool's is put back after):
    the error it raised, its events, whether the canary went tolerant, the probes, the weights."""
    pool_threads = torch.get_num_threads()
    torch.set_num_threads(run.threads[ctx.rank])
    try:
        return _train(ctx, run)
    finally:
        torch.set_num_threads(pool_threads)


def _train(ctx, run: HeteroRun) -> dict:
    torch.manual_seed(0)
    model = LayerNormNet()
    ddp = DDP(model)
    state = harden(ddp, SyncConfig(canary_every=run.canary_every), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mode = (FaultyMatmul(sdc_model(run.fault, run.value))
            if run.fault and ctx.rank == run.fault_rank else None)
    error = None
    try:
        with entered(mode):
            for step in range(run.steps):
                if mode is not None:
                    mode.active = step >= run.fault_step
                g = torch.Generator().manual_seed(1_000 * ctx.rank + step)
                x, y = torch.randn(BATCH, FEATURES, generator=g), torch.randint(
                    0, CLASSES, (BATCH,), generator=g)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        error = {"kind": exc.kind, "step": exc.step, "ranks": list(exc.ranks), "text": str(exc)}
    canary = state.canary
    reply = {"error": error, "events": [(e.kind, list(e.ranks)) for e in state.events],
             "details": [e.detail for e in state.events],
             "tolerant": canary is not None and canary.tolerant,
             "probes": canary.probes if canary is not None else 0,
             "weights": [p.detach().clone() for p in model.parameters()]}
    state.close(verify=error is None)
    return reply


def test_a_layernorm_probe_differs_bitwise_between_one_and_two_threads():
    """The premise: on this CPU the heterogeneity is real, not synthesized."""
    torch.manual_seed(0)
    net, x = LayerNormNet(), torch.randn(2, FEATURES)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_probe(net, list(net.named_parameters()), (x,), {}, seed=5)
        torch.set_num_threads(2)
        two = run_probe(net, list(net.named_parameters()), (x,), {}, seed=5)
    finally:
        torch.set_num_threads(threads)
    assert one.digest_list() != two.digest_list(), \
        "1 and 2 threads give bitwise equal probes here: no real heterogeneity"
    assert 0 < distance(one.figures.tolist(), two.figures.tolist()) < RTOL


def test_ranks_with_other_thread_counts_start_on_the_tolerance_naming_both_and_the_field(pools):
    replies = pools.get(2).run(hetero_task, HeteroRun())
    for reply in replies:  # two ranks: no majority, both named
        assert reply["events"] == [(CanaryEvent.UNREPRODUCIBLE, [0, 1])] and reply["tolerant"]
        assert "threads: the ranks disagree" in reply["details"][0]


def test_under_the_tolerance_heterogeneous_ranks_train_on_without_a_false_alarm(pools):
    run = HeteroRun()
    off, on = (pools.get(2).run(hetero_task, HeteroRun(canary_every=k)) for k in (0, 1))
    for a, b in zip(off, on):
        assert a["error"] is None and b["error"] is None, b["error"]
        assert b["probes"] == run.steps - 1  # a probe at every step after the first
        assert all(torch.equal(p, q) for p, q in zip(a["weights"], b["weights"], strict=True))


def test_under_the_tolerance_an_exponent_flip_is_still_named_on_the_faulty_rank(pools):
    """Two ranks: the fault on rank 0 is named with rank 1, both suspects (no majority)."""
    run = HeteroRun(fault="sdc-flip-high", value="1", fault_rank=0)
    replies = pools.get(2).run(hetero_task, run)
    for reply in replies:
        err = reply["error"]
        assert err is not None and err["kind"] == "ComputeMismatch", reply
        assert err["ranks"] == [0, 1] and "beyond the tolerance" in err["text"]
        assert run.fault_step <= err["step"] <= run.fault_step + 2 * run.canary_every
        assert reply["events"] == [(CanaryEvent.UNREPRODUCIBLE, [0, 1])]


@pytest.mark.slow
def test_on_four_ranks_the_odd_thread_count_is_named_and_a_flip_elsewhere_too(pools):
    """W = 4, one rank with 2 threads: its fingerprint names that outlier; a flip on another
    rank is then named as that rank alone."""
    run = HeteroRun(threads=(1, 1, 1, 2), fault="sdc-flip-high", value="1", fault_rank=1)
    for reply in pools.get(4).run(hetero_task, run):
        assert reply["events"] == [(CanaryEvent.UNREPRODUCIBLE, [3])]
        assert reply["error"]["kind"] == "ComputeMismatch" and reply["error"]["ranks"] == [1]
