"""The compute canary on a compiled model (``torch.compile`` before the DDP wrap: DDPOptimizer
splits the graph at the buckets). The probe runs the module the compiler wraps, eagerly, so
the compiled training step keeps its graphs: dynamo's counters — graphs compiled, frames,
graph breaks — are those of the same job without ``harden()``, the weights are bitwise the
same, and a rank whose matmuls compute wrong is still named."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.sdc_faults import FaultyMatmul, entered, sdc_model
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

STEPS, K = 8, 2


def _dynamo_figures() -> dict:
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"],
            "frames": dict(counters["frames"]),
            "graph_breaks": sum(counters["graph_break"].values())}


def compiled_task(ctx, hardened: bool, fault: bool = False) -> dict:
    """The same compiled MLP (dropout, LayerNorm) trained for ``STEPS`` on this rank, hardened
    with a probe every ``K`` steps or not, the last rank's matmuls faulty or not: dynamo's
    counters of the run, its error, the final weights."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # process-wide: a pool's earlier task would add up otherwise
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Dropout(0.1),
                        nn.Linear(32, 4))
    ddp = DDP(torch.compile(net))
    state = harden(ddp, SyncConfig(canary_every=K), ctx) if hardened else None
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    mode = (FaultyMatmul(sdc_model("sdc-ulp", "")) if fault and ctx.rank == ctx.world_size - 1
            else None)
    error = None
    torch.manual_seed(1 + ctx.rank)
    try:
        with entered(mode):
            for step in range(STEPS):
                if mode is not None:
                    mode.active = step >= 2
                g = torch.Generator().manual_seed(100 * ctx.rank + step)
                x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        error = (exc.kind, exc.step, tuple(exc.ranks))
    finally:
        probes = state.summary()["canary"]["probes"] if state is not None else 0
        if state is not None:
            state.close(verify=error is None)
    figures = _dynamo_figures()
    torch._dynamo.reset()
    return {"dynamo": figures, "error": error, "probes": probes,
            "weights": [p.detach().clone() for p in net.parameters()]}


def test_the_canary_leaves_a_compiled_step_its_graphs_and_its_weights(pools):
    pool = pools.get(2)
    plain, hardened = (pool.run(compiled_task, h) for h in (False, True))
    for a, b in zip(plain, hardened):
        assert b["error"] is None and b["probes"] == STEPS // K, b  # steps 1, 3, 5, 7
        assert a["dynamo"] == b["dynamo"], (a["dynamo"], b["dynamo"])
        assert a["dynamo"]["graphs"] > 0  # it really compiled
        assert all(torch.equal(p, q) for p, q in zip(a["weights"], b["weights"], strict=True))


def test_a_faulty_rank_under_a_compiled_model_is_named(pools):
    replies = pools.get(2).run(compiled_task, True, True)
    errors = {r["error"] for r in replies}
    assert len(errors) == 1, errors
    kind, step, ranks = errors.pop()
    assert kind == "ComputeMismatch" and ranks == (0, 1) and 2 <= step <= 2 + K + 1
