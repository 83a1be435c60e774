"""The fault × hook matrix's columns of PyTorch's own comm hooks (``ddp-allreduce``,
``ddp-bf16``, ``ddp-powersgd``; ``ddp-fp16`` is asserted with stock DDP in
``test_fault_matrix.py``): what each lets through, as measured here (torch 2.13, gloo, 2 ranks).

None of PyTorch's hooks checks anything, so each lets through what stock DDP lets through. For
PowerSGD "the result differs from the fault-free run" is judged against PowerSGD's own fault-free
run, which is deterministic (same seed, same collective order), so an approximating hook is not
mistaken for a corrupted one. A few well-defined cells run in CI; the whole columns under
``slow``.
"""

from __future__ import annotations

import pytest

from openclaw_ref.conformance.fault_matrix import MatrixRunner, MatrixSettings, case_task
from openclaw_ref.core.faults import FAULTS

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

SETTINGS = MatrixSettings()
HOOK_COLUMNS = ("ddp-allreduce", "ddp-bf16", "ddp-powersgd")

# What every hook column does, measured; the same facts as stock DDP's (test_fault_matrix.py).
HOOK_FACTS: dict[str, str] = {
    "late-rank": "no-effect",  # DDP waits; nothing is measured or reported
    "local-buckets": "crash",  # different bucket sizes: gloo aborts the process (SIGABRT)
    "scale-mismatch": "silent-corruption",  # replicas diverge
    "missing-grad": "silent-corruption",  # zero-filled as if unused: the average is halved
    "permuted-params": "silent-corruption",  # buckets sum q with v
    "bitflip": "silent-corruption",  # no hook compares parameters
    "nan-grad": "silent-corruption",  # NaN averaged (PowerSGD: spread through P and Q)
    "crash": "crash",
    "hang": "hang-timeout",  # gloo's own collective timeout on the waiting rank
}


@pytest.fixture(scope="module")
def runner(pools):
    r = MatrixRunner(SETTINGS, get_pool=pools.get)
    yield r
    r.close()


@pytest.mark.parametrize("strategy,fault", [("ddp-allreduce", "bitflip"),
                                            ("ddp-powersgd", "bitflip"),
                                            ("ddp-powersgd", "missing-grad")])
def test_pytorchs_hook_lets_the_fault_through_silently(runner, strategy, fault):
    cell = runner.run_case(strategy, fault)
    assert cell.outcome == "silent-corruption", cell


def test_powersgds_fault_free_run_is_its_own_reference(runner, pools):
    """The false-alarm side of the PowerSGD column: a second fault-free run ends bit for bit
    where the first did, so "differs from the fault-free run" measures the fault alone."""
    reference = runner.reference("ddp-powersgd")
    reply = pools.get(SETTINGS.world_size).run(
        case_task, SETTINGS.train_config("ddp-powersgd", None),
        timeout_s=SETTINGS.case_timeout_s)[0]
    assert reply[0] == "ok" and reply[1]["summary"]["replicas_equal"]
    assert reply[1]["summary"]["param_digest"] == reference


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("strategy", HOOK_COLUMNS)
def test_pytorchs_hook_outcome_is_the_measured_fact(runner, strategy, fault):
    cell = runner.run_case(strategy, fault)
    print(f"{strategy:13s} {fault:16s} {cell.wall_s:5.1f} s  {cell.summary()}")
    assert cell.outcome == HOOK_FACTS[fault], cell
