"""PyTorch's own comm hooks as strategies (``ddp-allreduce``, ``ddp-fp16``, ``ddp-bf16``,
``ddp-powersgd``): each is registered on DDP as a user registers it, and N ranks end where one
process ends on the same global batch, within the tolerance its wire — or, for PowerSGD, its
error-feedback bound (``conformance/tolerance.py``) — allows. The bound must still be tight
enough to fail a run that does not average at all."""

from __future__ import annotations

import pytest

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.conformance.checks import check_equivalence
from openclaw_ref.conformance.recorders import observed_run
from openclaw_ref.conformance.settings import ConformSettings
from openclaw_ref.conformance.tolerance import POWERSGD, POWERSGD_RESIDUAL_BOUND, powersgd_atol
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.config import TRAIN_PRESETS
from openclaw_ref.sync.target import registered_hook

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

HOOKS = {"ddp-allreduce": "allreduce_hook", "ddp-fp16": "fp16_compress_hook",
         "ddp-bf16": "bf16_compress", "ddp-powersgd": "powersgd_in_bucket_order"}


def settings(name: str) -> ConformSettings:
    return ConformSettings(sync=ArmConfig(name=name))


class HookSeen(Callback):
    """After each sync: the hook registered on the DDP wrapper, and PowerSGD's element counts
    before/after compression (its own statistics; None for the other hooks)."""

    def __init__(self) -> None:
        self.hook: str | None = None
        self.compression: tuple[int, int] | None = None

    def after_sync(self, step, model, strategy, applied) -> None:
        self.hook = registered_hook(strategy.ddp)
        state = getattr(strategy, "powersgd", None)
        if state is not None:
            self.compression = (state.total_numel_before_compression,
                                state.total_numel_after_compression)


def hook_seen(ctx, name: str) -> tuple[str | None, tuple[int, int] | None]:
    """A rank task: 3 steps of ``name`` (PowerSGD compresses the last); what ``HookSeen`` saw."""
    s = settings(name)
    seen = HookSeen()
    observed_run(ctx, s.train_config(ctx.world_size, steps=3), seen)
    return seen.hook, seen.compression


@pytest.fixture(scope="module")
def seen(pools) -> dict[str, tuple]:
    """One short 2-rank run per hook strategy, shared by the tests below."""
    return {name: pools.get(2).run(hook_seen, name, timeout_s=120)[0] for name in HOOKS}


@pytest.mark.parametrize("strategy", list(HOOKS))
def test_the_strategy_registers_pytorchs_hook_on_ddp(seen, strategy):
    assert seen[strategy][0] == HOOKS[strategy]


def test_powersgd_compresses_from_its_start_iteration(seen):
    before, after = seen[POWERSGD][1]
    assert 0 < after < before / 4, (before, after)


@pytest.mark.parametrize("strategy", list(HOOKS))
def test_two_ranks_equal_one_process_within_the_hooks_tolerance(pools, conformance_report,
                                                                  strategy):
    result = conformance_report.add_check(
        pools.get(2).run(check_equivalence, settings(strategy), timeout_s=120)[0])
    assert result.passed, result.detail


def test_powersgd_tolerance_fails_a_run_that_does_not_average(pools):
    train = TRAIN_PRESETS["conformance"]
    atol = powersgd_atol(train.lr, train.steps)
    result = pools.get(2).run(check_equivalence, settings("local"), timeout_s=120)[0]
    assert result.figures["max_abs_param_diff"] > 2 * atol, (result.figures, atol)


def test_powersgd_tolerance_grows_with_the_compressed_steps_only():
    lr = 1e-3
    assert powersgd_atol(lr, 2) == 0.0  # steps 0 and 1: vanilla allreduce, nothing held back
    assert powersgd_atol(lr, 3) == pytest.approx(lr * POWERSGD_RESIDUAL_BOUND)
    assert powersgd_atol(lr, 4) == pytest.approx(lr * POWERSGD_RESIDUAL_BOUND * (1 + 0.9))

