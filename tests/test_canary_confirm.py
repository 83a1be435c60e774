"""The compute canary confirms before it raises (``sync/canary/verdict.py``), driven
to every outcome on real gloo ranks (``experiments/canary_confirm.py``):

- honest non-determinism on EVERY rank (the emulated GPU noise: one ulp at a random element of
  a matrix product, forward or backward, at several rates, from step 0 or mid-run, fp32 and
  bf16 autocast) never raises — it switches the canary to its tolerance or is reported;
- a persistent fault is named: the outlier at W = 3, both suspects at W = 2, from step 0 or
  mid-run, within K + 1 steps;
- a one-rank intermittent fault is reported (``CanaryTransient``) and then named after
  ``STRIKES`` one-offs beyond the tolerance.
Every rank tells the same story: the same error, step, ranks and events.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.nondeterminism import Phase
from openclaw_ref.experiments.canary_confirm import (
    ConfirmCase,
    Fault,
    Noise,
    confirm_cases_task,
)
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.canary.row import STRIKES, CanaryEvent
from openclaw_ref.sync.hardening import harden

K = 2
STEPS = 20
NOISE = [Noise(rate, phase, start) for rate in (1.0, 0.05) for phase in (Phase.FORWARD,
                                                                          Phase.BACKWARD)
         for start in (0, 9)]


def _same_story(replies: list[list[dict]]) -> list[dict]:
    """Every rank's runs agree on what was raised and recorded; rank 0's runs."""
    keys = ("error", "step", "ranks", "events")
    for other in replies[1:]:
        assert [[r[k] for k in keys] for r in other] == [[r[k] for k in keys]
                                                         for r in replies[0]]
    return replies[0]


def _run(pools, world: int, cases: list[ConfirmCase]) -> list[dict]:
    return _same_story(pools.get(world).run(confirm_cases_task, cases))


@pytest.mark.parametrize("world", [2, 4])
def test_noise_on_every_rank_forward_or_backward_never_raises(pools, world):
    cases = [ConfirmCase(steps=STEPS, every=K, noise=n) for n in NOISE]
    for case, run in zip(cases, _run(pools, world, cases)):
        assert not run["error"], (case, run["message"])
        assert run["noised"] > 0, case  # the noise really fired on this rank
        if case.noise.rate == 1.0:  # every probe varies: the tolerance, said so
            assert run["canary"]["mode"] == "tolerance", (case, run["canary"])
            assert any(kind == CanaryEvent.UNREPRODUCIBLE for kind, _ in run["events"])


def test_noise_under_bf16_autocast_never_raises_and_takes_the_16_bit_tolerance(pools):
    cases = [ConfirmCase(steps=STEPS, every=K, noise=Noise(rate), bf16=True)
             for rate in (1.0, 0.05)]
    for case, run in zip(cases, _run(pools, 2, cases)):
        assert not run["error"], (case, run["message"])
        assert run["canary"]["rtol"] >= 1e-2, run["canary"]


def test_rare_noise_on_every_rank_never_adds_up_to_a_raise(pools):
    """Many probes (K = 1), noise rare enough that most mismatches are one-offs on a single
    rank: the strikes never add up, whichever ranks they land on."""
    cases = [ConfirmCase(steps=40, every=1, noise=Noise(rate), seed=seed)
             for rate in (0.01, 0.03) for seed in range(3)]
    runs = _run(pools, 2, cases)
    assert not [r["message"] for r in runs if r["error"]]
    assert any(r["canary"]["transients"] for r in runs)  # one-offs did happen, reported


@pytest.mark.parametrize("start", [0, 9])
def test_a_persistent_fault_is_named_as_the_outlier_on_three_ranks(pools, start):
    case = ConfirmCase(steps=STEPS, every=K, fault=Fault("sdc-ulp", 1, start=start))
    (run,) = _run(pools, 3, [case])
    assert run["error"] == "ComputeMismatch" and run["ranks"] == [1], run["message"]
    assert start <= run["step"] <= start + K + 1
    assert "drain the named node" in run["message"] and "reproduced them on 3 runs" in \
        run["message"]


@pytest.mark.parametrize("start", [0, 9])
@pytest.mark.parametrize("faulty", [0, 1])
def test_a_persistent_fault_on_two_ranks_names_both_as_suspects(pools, start, faulty):
    case = ConfirmCase(steps=STEPS, every=K, fault=Fault("sdc-backward", faulty, start=start))
    (run,) = _run(pools, 2, [case])
    assert run["error"] == "ComputeMismatch" and run["ranks"] == [0, 1], run["message"]
    assert start <= run["step"] <= start + K + 1
    assert "either side may be the faulty one" in run["message"]
    assert "drain" not in run["message"]


@pytest.mark.parametrize("world", [2, 3])
def test_a_one_rank_intermittent_fault_is_reported_then_named_at_the_strikes(pools, world):
    case = ConfirmCase(steps=40, every=1, fault=Fault("sdc-flip-exp", 1, "0.3", start=4))
    (run,) = _run(pools, world, [case])
    assert run["error"] == "ComputeMismatch" and run["ranks"] == [1], run["message"]
    assert "intermittently" in run["message"]
    transients = [e for e in run["events"] if e[0] == CanaryEvent.TRANSIENT]
    assert len(transients) >= STRIKES and all(e[1] == [1] for e in transients)
    assert run["canary"]["strikes"] == {"1": STRIKES}


class FragileNet(nn.Module):
    """Raises on a 2-row input (the probe's slice) where ``fragile`` is set: a probe that
    fails on one rank only."""

    def __init__(self, fragile: bool) -> None:
        super().__init__()
        self.fragile = fragile
        self.body = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fragile and x.shape[0] == 2:
            raise RuntimeError("this rank cannot run a 2-row batch")
        return self.body(x)


def fragile_task(ctx, threads: tuple[int, ...]) -> dict:
    """Rank 1's probe raises; ``threads`` per rank (unequal: the tolerance from the start)."""
    pool_threads = torch.get_num_threads()
    torch.set_num_threads(threads[ctx.rank])
    try:
        torch.manual_seed(0)
        model = FragileNet(fragile=ctx.rank == 1)
        ddp = DDP(model)
        state = harden(ddp, SyncConfig(canary_every=2), ctx)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for step in range(6):
                g = torch.Generator().manual_seed(10 * ctx.rank + step)
                F.cross_entropy(ddp(torch.randn(8, 12, generator=g)),
                                torch.randint(0, 4, (8,), generator=g)).backward()
                opt.step()
                opt.zero_grad()
        reply = {"canary": state.summary()["canary"],
                 "events": [(str(e.kind), e.ranks, e.step) for e in state.events],
                 "warned": [str(w.message) for w in seen
                            if "this rank's probe raised" in str(w.message)]}
        state.close()
        return reply
    finally:
        torch.set_num_threads(pool_threads)


@pytest.mark.parametrize("threads", [(1, 1), (1, 2)], ids=["bitwise", "tolerance"])
def test_a_probe_that_raises_on_one_rank_turns_the_canary_off_everywhere_and_ends_nothing(
        pools, threads):
    replies = pools.get(2).run(fragile_task, threads)
    offs = [[e for e in r["events"] if e[0] == CanaryEvent.UNAVAILABLE] for r in replies]
    assert offs[0] == offs[1] and len(offs[0]) == 1 and offs[0][0][1] == [1], offs
    assert all(r["canary"]["mode"] == "off" and "could not run" in r["canary"]["why"]
               for r in replies)
    assert replies[1]["warned"] and not replies[0]["warned"]  # the cause, on its own rank
