"""``torch.compile`` before the DDP wrap (nanoGPT's ``compile=True``) is a supported set-up: on
2 gloo ranks, with DDP's buckets small enough that DDPOptimizer splits the compiled graph at
them, ``harden()`` trains bitwise like the same compiled model without it, adds no graph break
and no recompile — read from dynamo's own counters, which a deliberate recompile and graph
break in the same task show are live — and a rank with another learning rate is still named.
``harden()`` runs at its defaults, so the compute canary probes too (its start-up probe falls
in the first steps). Compiled autograd is refused: torch itself refuses it with DDP's C++
reducer (hardened or not), and ``harden()`` refuses, with ``BadInput`` naming it, the Python
reducer it needs.

Every compiled arm starts from ``torch._dynamo.reset()`` in the session's 2-rank pool, so the
two arms' counters count the same work; inductor's on-disk cache makes the second arm's
kernels cache hits (its ``inductor`` counters are therefore not compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.hardening import harden
from tests.helpers import ROOT

STEPS = 6
FAULT_STEPS = 18  # > replica_slices (16): every slice compared at least once
BUCKET_CAP_MB = 1  # DDP's first bucket is 1 MB: DDPOptimizer asserts no later one is smaller


def _net() -> nn.Module:
    """2.3 MB of parameters: three 1 MB buckets, so DDPOptimizer compiles three subgraphs."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                         nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1))


def _counters() -> dict:
    """What dynamo compiled: frames, graphs, graph breaks, AOT-compiled (split) subgraphs."""
    from torch._dynamo.utils import counters

    return {"frames": dict(counters["frames"]),
            "unique_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": dict(counters["graph_break"]),
            "aot_subgraphs": counters["aot_autograd"]["total"]}


def _compiled_run(ctx, hardened: bool, lr_rank1: float = 0.01, steps: int = STEPS) -> dict:
    """Compile, then wrap, then (maybe) harden; train; the losses, final parameters, dynamo's
    counters and the error the run stopped on."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ddp = DDP(torch.compile(_net()), bucket_cap_mb=BUCKET_CAP_MB)
    state = harden(ddp) if hardened else None
    opt = torch.optim.SGD(ddp.parameters(), lr=lr_rank1 if ctx.rank == 1 else 0.01)
    data = torch.Generator().manual_seed(100 + ctx.rank)
    seen: dict = {"losses": [], "error": None}
    try:
        for _ in range(steps):
            x = torch.randn(16, 32, generator=data) * (1 + ctx.rank)
            loss = F.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            seen["losses"].append(loss.item())
    except ReplicaDivergence as exc:
        seen["error"] = exc
    finally:
        if state is not None:
            state.close(verify=seen["error"] is None)
            seen["events"] = [e.kind for e in state.events]
            seen["probes"] = (state.summary().get("canary") or {}).get("probes", 0)
    seen["counters"] = _counters()
    seen["params"] = [p.detach().clone() for p in ddp.parameters()]
    rebuilt = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")  # after iteration 1
    seen["buckets"] = len(str(rebuilt).split(","))
    return seen


def _counters_are_live(ctx) -> dict:
    """The same counters after a deliberate recompile (a new input size) and a deliberate
    graph break, on a small function: what the arms' equality would miss if they were dead."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    @torch.compile
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    @torch.compile
    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    scaled(torch.randn(3))
    before = _counters()
    scaled(torch.randn(5))  # another size: dynamo recompiles
    broken(torch.randn(3))
    return {"before": before, "after": _counters()}


def _compiled_arms(ctx) -> dict:
    """One task: the stock compiled arm, the hardened one, and the live-counter check."""
    return {"stock": _compiled_run(ctx, hardened=False),
            "hardened": _compiled_run(ctx, hardened=True),
            "live": _counters_are_live(ctx)}


def test_a_model_compiled_before_the_wrap_trains_bitwise_without_a_graph_break_or_recompile(
        pools):
    for rank, seen in enumerate(pools.get(2).run(_compiled_arms)):
        stock, hardened = seen["stock"], seen["hardened"]
        assert stock["error"] is None and hardened["error"] is None
        assert hardened["events"] == []
        assert hardened["probes"] >= 1  # harden()'s defaults: the compute canary probed too
        assert hardened["losses"] == stock["losses"]  # bitwise: float equality of every loss
        assert all(torch.equal(a, b) for a, b in zip(stock["params"], hardened["params"]))
        # DDPOptimizer split the graph at DDP's buckets in both arms: one dynamo graph, one
        # AOT-compiled subgraph per bucket
        assert stock["buckets"] == hardened["buckets"] == 3, rank
        assert stock["counters"]["aot_subgraphs"] == stock["buckets"]
        # what harden() adds to the compile: nothing
        assert hardened["counters"] == stock["counters"], rank
        assert stock["counters"]["graph_breaks"] == {} and stock["counters"]["unique_graphs"] == 1
        live = seen["live"]
        assert live["after"]["unique_graphs"] > live["before"]["unique_graphs"]
        assert live["after"]["graph_breaks"] and not live["before"]["graph_breaks"]


def _lr_fault(ctx) -> dict:
    return {"stock": _compiled_run(ctx, hardened=False, lr_rank1=0.02, steps=FAULT_STEPS),
            "hardened": _compiled_run(ctx, hardened=True, lr_rank1=0.02, steps=FAULT_STEPS)}


def test_a_rank_with_another_learning_rate_is_named_under_compile(pools):
    runs = pools.get(2).run(_lr_fault)
    # stock DDP: silent, the replicas part
    assert all(r["stock"]["error"] is None for r in runs)
    assert not all(torch.equal(a, b) for a, b in zip(runs[0]["stock"]["params"],
                                                     runs[1]["stock"]["params"]))
    errors = [r["hardened"]["error"] for r in runs]
    assert all(isinstance(e, ReplicaDivergence) for e in errors), errors
    assert errors[0].step == errors[1].step and errors[0].step < FAULT_STEPS
    # two ranks, no majority: both are suspects, on both ranks (evidence/vote.py)
    assert errors[0].ranks == errors[1].ranks == [0, 1]


# A fresh interpreter, one rank: DDP under optimize_ddp="python_reducer" rewrites inductor's
# and dynamo's global settings, which must not leak into the session's pool.
COMPILED_AUTOGRAD = r"""
import json, os, tempfile
import torch, torch._dynamo
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from openclaw_ref.sync import BadInput, harden

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
seen = {}

def backward_under_compiled_autograd(ddp):
    loss = ddp(torch.randn(4, 8)).sum()
    try:
        with torch._dynamo.compiled_autograd._enable(torch.compile):
            loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return None

stock = DDP(torch.nn.Linear(8, 2))
seen["stock"] = backward_under_compiled_autograd(stock)
hardened = DDP(torch.nn.Linear(8, 2))
state = harden(hardened)
seen["hardened"] = backward_under_compiled_autograd(hardened)
state.close()
with torch._dynamo.config.patch(optimize_ddp="python_reducer"):
    reducer = DDP(torch.nn.Linear(8, 2))
try:
    harden(reducer)
except BadInput as exc:
    seen["refused"] = str(exc)
seen["untouched"] = not reducer._comm_hooks and not hasattr(reducer, "_openclaw_guard")
del stock, hardened, reducer, state
dist.destroy_process_group()
print(json.dumps(seen))
"""


def test_compiled_autograd_is_refused_by_torch_or_by_harden_naming_it():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", COMPILED_AUTOGRAD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # with DDP's C++ reducer torch refuses compiled autograd itself, hardened or not
    assert "not compatible with C++ DDP Reducer" in seen["stock"]
    assert seen["hardened"] == seen["stock"]
    # the Python reducer it asks for instead: refused before anything is registered
    assert "compiled autograd" in seen["refused"] and "python_reducer" in seen["refused"]
    assert seen["untouched"]
