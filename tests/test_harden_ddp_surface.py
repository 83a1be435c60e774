"""DDP's public surface beside training, after ``harden()`` with its defaults, 2 gloo ranks, each
behaviour beside the same stock DDP job: ``static_graph=True`` and ``_set_static_graph()``,
``join()`` with uneven inputs, ``train()``/``eval()`` around a no-grad evaluation,
``zero_grad(set_to_none=False)``, ``delay_all_reduce_named_params`` (with a barrier before the
optimizer step in both arms: DDP never waits for its delayed allreduce) — each trains silent
and bitwise as stock; ``_get_ddp_logging_data()`` answers as on stock DDP; ``register_comm_hook``
and ``_register_builtin_comm_hook`` are refused with ``BadInput`` naming the way out, before
DDP records anything, and work again after ``close()``. A compiled DDP
(``torch.compile(ddp)``) trains silent with equal replicas, no warning, within float rounding
of the same compiled stock DDP — not bitwise: torch 2.13's dynamo compiles a DDP's module
only once a forward hook is on it (the guard's; stock DDP's compiles nothing here), and
compiled kernels round differently — and ``DistributedDataParallel._get_active_ddp_module()``
is ``None`` between forwards as on stock. Two jobs (eager, compiled) check every behaviour;
each test reads one."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.errors import BadInput, ConsistencyError
from openclaw_ref.sync.hardening import harden

STEPS = 4
BUCKET_CAP_MB = 1  # the compiled net's 1 MB buckets: DDPOptimizer splits at them


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 1))


def _build(case: str) -> DDP:
    net = _net()
    if case == "delay_all_reduce_named_params":  # the last layer's allreduce delayed to the
        delayed = list(net[4].named_parameters(prefix="4"))  # first layer's gradient
        return DDP(net, delay_all_reduce_named_params=delayed,
                   param_to_hook_all_reduce=net[0].weight)
    ddp = DDP(net, static_graph=case == "static_graph=True")
    if case == "_set_static_graph()":
        ddp._set_static_graph()
    return ddp


def _train(ctx, ddp: DDP, case: str) -> list[torch.Tensor]:
    """``STEPS`` steps of ``case``; the final parameters."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    steps = STEPS + ctx.rank if case == "join()" else STEPS  # uneven inputs
    with ddp.join() if case == "join()" else contextlib.nullcontext():
        for _ in range(steps):
            ddp(torch.randn(4, 8, generator=gen)).square().mean().backward()
            if case == "delay_all_reduce_named_params":
                dist.barrier()  # DDP drops its delayed allreduce's work (async, never waited):
                # on gloo the optimizer could read the gradients before it lands; gloo's
                # barrier waits for the work issued before it, in both arms alike
            opt.step()
            if case == "zero_grad(set_to_none=False)":
                ddp.zero_grad(set_to_none=False)
            else:
                opt.zero_grad()
            if case == "train()/eval()":  # an evaluation between steps
                ddp.eval()
                with torch.no_grad():
                    ddp(torch.randn(4, 8, generator=gen))
                ddp.train()
    return [p.detach().clone() for p in ddp.module.parameters()]


CASES = ["static_graph=True", "_set_static_graph()", "join()", "train()/eval()",
         "zero_grad(set_to_none=False)", "delay_all_reduce_named_params"]


def _bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _refusal(call) -> str | None:
    try:
        call()
    except BadInput as exc:
        return str(exc)
    return None


def eager_task(ctx) -> dict:
    """Every eager case stock and hardened; the logging data; the comm-hook refusals."""
    reply: dict = {"cases": {}}
    for case in CASES:
        stock = _train(ctx, _build(case), case)
        ddp = _build(case)
        state = harden(ddp)
        try:
            hardened, error = _train(ctx, ddp, case), None
        except ConsistencyError as exc:
            hardened, error = [], f"{type(exc).__name__}: {exc}"
        state.close(verify=error is None)
        reply["cases"][case] = {"error": error, "bitwise": _bitwise(hardened, stock)}
    stock, ddp = _build("plain"), _build("plain")
    state = harden(ddp)
    _train(ctx, stock, "plain")
    _train(ctx, ddp, "plain")
    got, want = ddp._get_ddp_logging_data(), stock._get_ddp_logging_data()
    reply["logging"] = {"keys": set(got) == set(want),
                        "same": {k: got.get(k) == want.get(k)
                                 for k in ("comm_hook", "bucket_sizes", "world_size",
                                           "find_unused_parameters", "static_graph")}}
    reply["refusals"] = {
        "register_comm_hook": _refusal(
            lambda: ddp.register_comm_hook(None, default_hooks.allreduce_hook)),
        "_register_builtin_comm_hook": _refusal(
            lambda: ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS))}
    reply["recorded_nothing"] = not ddp._comm_hooks
    state.close()
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)  # DDP's own method again
    after = _train(ctx, ddp, "plain")
    stock.register_comm_hook(None, default_hooks.allreduce_hook)
    reply["hook_after_close_bitwise"] = _bitwise(after, _train(ctx, stock, "plain"))
    return reply


def compiled_task(ctx) -> dict:
    """A compiled DDP stock, then hardened: parameters, whether the replicas agree, the
    active DDP module between forwards, the warnings."""
    import warnings

    import torch._dynamo

    reply: dict = {}
    for arm in ("stock", "hardened"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                            nn.Linear(512, 1))
        ddp = DDP(net, bucket_cap_mb=BUCKET_CAP_MB)
        state = harden(ddp) if arm == "hardened" else None
        compiled = torch.compile(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(100 + ctx.rank)
        active = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(STEPS):
                compiled(torch.randn(16, 32, generator=gen)).square().mean().backward()
                active.append(DDP._get_active_ddp_module())
                opt.step()
                opt.zero_grad()
            if state is not None:
                state.close()
                reply["events"] = [e.kind for e in state.events]
        flat = torch.cat([p.detach().flatten() for p in net.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, flat)
        reply[arm] = {"params": flat, "replicas_equal": torch.equal(*gathered),
                      "active_between": [a is None for a in active],
                      "warnings": [m for m in (str(w.message)[:200] for w in caught)
                                   if "openclaw" in m or "canary" in m]}
    return reply


@pytest.fixture(scope="module")
def eager(pools):
    return pools.get(2).run(eager_task)


@pytest.fixture(scope="module")
def compiled(pools):
    return pools.get(2).run(compiled_task, timeout_s=600)


@pytest.mark.parametrize("case", CASES)
def test_a_ddp_option_or_method_trains_silent_and_bitwise_as_stock_after_harden(eager, case):
    for reply in eager:
        got = reply["cases"][case]
        assert got["error"] is None, got["error"]
        assert got["bitwise"]


def test_ddp_logging_data_answers_as_on_stock_ddp(eager):
    for reply in eager:
        assert reply["logging"]["keys"]
        assert all(reply["logging"]["same"].values()), reply["logging"]["same"]


@pytest.mark.parametrize("method", ["register_comm_hook", "_register_builtin_comm_hook"])
def test_a_comm_hook_registered_after_harden_is_refused_naming_the_way_out(eager, method):
    for reply in eager:
        words = reply["refusals"][method]
        assert words is not None, f"{method} was not refused"
        assert "cannot guard a comm hook it does not own" in words
        assert "close() the guard first" in words and "wire='fp16'" in words
        assert reply["recorded_nothing"]  # refused before DDP recorded the hook


def test_a_comm_hook_registers_and_trains_as_stock_after_close(eager):
    assert all(reply["hook_after_close_bitwise"] for reply in eager)


def test_a_compiled_ddp_trains_silent_with_equal_replicas_as_the_compiled_stock_ddp(compiled):
    for reply in compiled:
        assert reply["events"] == [] and reply["hardened"]["warnings"] == []
        assert reply["hardened"]["replicas_equal"] and reply["stock"]["replicas_equal"]
        torch.testing.assert_close(reply["hardened"]["params"], reply["stock"]["params"],
                                   rtol=1e-5, atol=1e-7)


def test_the_active_ddp_module_is_none_between_compiled_forwards_as_on_stock(compiled):
    for reply in compiled:
        assert reply["hardened"]["active_between"] == reply["stock"]["active_between"]
        assert all(reply["hardened"]["active_between"])
