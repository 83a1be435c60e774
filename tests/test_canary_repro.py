"""The reproducibility checks that decide, on a GPU, whether the compute canary may be on by
default (``experiments/canary_repro.py``; the GPU run is ``tests/test_gpu_canary.py``): here
they run on CPU gloo ranks, where the probe is bitwise stable, and on modules made
non-deterministic on purpose, which they must count — a checker that cannot fail proves
nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from openclaw_ref.core.sdc_faults import BACKWARD, BOTH, FORWARD
from openclaw_ref.experiments.canary_repro import (
    FalseAlarmCase,
    ProbeModel,
    false_alarm_task,
    repeat_probes,
    repeat_task,
    stable_or_tolerated,
)
from tests.test_gpu_canary import injector_flips


class Drifting(nn.Module):
    """A layer whose result moves by a few ulps from its ``start``-th call on, once per call:
    what a kernel that is non-deterministic only sometimes does to the probe."""

    def __init__(self, start: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 2)
        self.calls, self.start = 0, start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        drift = 1 + 2.0 ** -22 * max(0, self.calls - self.start + 1)
        return self.b(torch.relu(self.a(x)) * drift)


def test_a_deterministic_probe_repeats_bitwise():
    net = Drifting(start=10**9)
    got = repeat_probes(net, (torch.randn(2, 6),), {}, repeats=8)
    assert (got.differing, got.distinct, got.first_param) == (0, 1, None)
    assert got.worst_distance == 0.0 and len(got.digest) == 16


def test_every_repeat_that_differs_is_counted_with_the_first_parameter_and_its_size():
    got = repeat_probes(Drifting(start=1), (torch.randn(2, 6),), {}, repeats=8)
    assert got.differing == 7 and got.distinct == 8
    assert got.first_param == "a.weight"
    assert 0 < got.worst_distance < 1e-4  # a few ulps: what the tolerance would absorb


def test_a_probe_that_drifts_only_after_the_self_tests_two_runs_is_still_counted():
    """The self-test's two runs agree; the third and later do not — the case the GPU run must
    rule out, since a bitwise canary would then raise a false ComputeMismatch."""
    got = repeat_probes(Drifting(start=3), (torch.randn(2, 6),), {}, repeats=10)
    assert got.differing == 8


@pytest.mark.parametrize("model", [ProbeModel.MLP, ProbeModel.TINY])
def test_the_probe_of_the_cost_tables_models_repeats_bitwise_on_cpu_ranks(pools, model):
    replies = pools.get(2).run(repeat_task, model.value, 5)
    for r in replies:
        assert r["device"] == "cpu" and not r["deterministic_algorithms"]
        assert r["differing"] == 0 and r["distinct"] == 1, r
    assert replies[0]["digest"] == replies[1]["digest"]  # rank 0's input on both ranks


@pytest.mark.parametrize("model,steps", [(ProbeModel.MLP, 8), (ProbeModel.TINY, 4)])
def test_a_healthy_job_probing_every_step_is_stable_and_raises_nothing_on_cpu_ranks(
        pools, model, steps):
    replies = pools.get(2).run(false_alarm_task, FalseAlarmCase(model.value, steps, repeats=3))
    for r in replies:
        assert stable_or_tolerated(r), r
        assert r["events"] == [] and not r["tolerant"]  # same threads, same CPU: bitwise
        assert r["probes"] == steps - 1 and r["steps"] == steps
        assert r["repeats"]["differing"] == 0


def _reply(error: str | None = None, differing: int = 0, tolerant: bool = False) -> dict:
    return {"error": error, "tolerant": tolerant, "repeats": {"differing": differing}}


def test_the_condition_holds_for_stable_or_tolerated_probes_only_and_never_with_an_error():
    assert stable_or_tolerated(_reply())
    assert stable_or_tolerated(_reply(differing=3, tolerant=True))
    assert not stable_or_tolerated(_reply(differing=3))  # unseen by the self-test
    assert not stable_or_tolerated(_reply(error="ComputeMismatch at step 7"))


def test_the_sdc_injector_flips_element_zero_in_the_phase_it_models_on_cpu():
    flips = injector_flips(SimpleNamespace(device=torch.device("cpu")))
    assert flips == {BOTH: (1, 1), FORWARD: (1, 0), BACKWARD: (0, 1)}
