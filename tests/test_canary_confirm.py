"""The compute canary confirms before it raises (``sync/evidence/canary_verdict.py``), driven
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

import pytest

from openclaw_ref.core.nondeterminism import Phase
from openclaw_ref.experiments.canary_confirm import (
    ConfirmCase,
    Fault,
    Noise,
    confirm_cases_task,
)
from openclaw_ref.sync.evidence.canary import STRIKES, CanaryEvent

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
