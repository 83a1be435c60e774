"""The FSDP2 healthy-jobs table (the FSDP2 rows of the false-alarm corpus, beside the DDP rows
of ``test_false_alarms.py``): ``harden()`` at its defaults on ``fully_shard`` neither stops nor
changes a healthy job. Each cell of ``fsdp_run.FSDP_OPTION_SETS`` — the default,
``reshard_after_forward=False``, gradient accumulation with ``set_requires_gradient_sync(False)``,
activation checkpointing on every sharded block, ``CPUOffloadPolicy`` (``pin_memory=False``: the
only form that runs without an accelerator), a 0.5 s pause of rank 0 before an optimizer step (a
load; it orders nothing) — trains the suite's own FSDP2 model with ``harden()`` and with stock
``fully_shard`` on the same shards: bit for bit equal after every step, no error, no event.
2 ranks on a 1-D mesh here; HSDP on a 2 × 2 mesh under ``slow``."""

from __future__ import annotations

import pytest

from openclaw_ref.conformance.fsdp_run import FSDP_OPTION_SETS
from openclaw_ref.conformance.oracle import TargetRuns
from openclaw_ref.conformance.target import TargetSpec, with_default_subject
from openclaw_ref.conformance.user_checks import equivalence_from

pytestmark = [pytest.mark.conformance, pytest.mark.zoo]

MODEL = "openclaw_ref.conformance.zoo.fsdp:mlp"


@pytest.fixture(scope="module")
def runs(pools):
    return TargetRuns(pools.get)


def _assert_exact_and_silent(runs, wrapper, world_size, option_set):
    spec = with_default_subject(TargetSpec(MODEL, None, world_size, "fp32", wrapper))
    options = FSDP_OPTION_SETS[option_set]
    oracle = runs.oracle(spec, options)
    assert not oracle.error, oracle.error
    subject = runs.runs(spec, options)
    result = equivalence_from(spec, option_set, oracle, subject)
    assert result.passed and result.figures["bitwise_required"], result.detail
    assert [r.error_text for r in subject.records] == [""] * world_size
    assert [e for r in subject.records for e in r.events] == []


@pytest.mark.parametrize("option_set", list(FSDP_OPTION_SETS))
def test_harden_on_fsdp2_is_bitwise_and_silent_on_a_healthy_job(runs, option_set):
    _assert_exact_and_silent(runs, "fsdp2", 2, option_set)


@pytest.mark.slow
@pytest.mark.parametrize("option_set", list(FSDP_OPTION_SETS))
def test_harden_on_hsdp_is_bitwise_and_silent_on_a_healthy_job(runs, option_set):
    _assert_exact_and_silent(runs, "hsdp", 4, option_set)
