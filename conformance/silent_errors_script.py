"""Published DDP silent errors, written the way a user writes them, on a plain 4-layer MLP.

    torchrun --standalone --nproc-per-node 2 -m openclaw_ref.conformance.silent_errors_script \
        --pattern clip-one-rank --column hardened-k1

The script's only hardening is ``harden(ddp)`` (column ``hardened``: its defaults;
``hardened-k1``: a replica comparison at every step). ``ddp`` is stock DDP; ``ddp-detail`` is
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` as it runs on gloo (see
``openclaw_ref/arms/detail.py``).
``--pattern none`` is the clean run. Rank 0 prints one JSON line (and writes ``--out``):
``outcome`` "detected" (with the check, step, ranks and parameters it named) or "finished"
(with the parameter digest and whether every rank ended with the same parameters).

Every pattern is in ``PATTERNS``; the one-rank ones act on rank 1 from step ``FAULT_STEP``.
The same corpus on the openclaw model: ``openclaw_ref/core/corpus_faults.py``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.conformance.corpus import SCRIPT_STEPS, hardened_k1
from openclaw_ref.sync import harden
from openclaw_ref.sync.errors import ConsistencyError

PATTERNS = ("none", "convert-after-wrap", "forward-via-module", "param-replaced-after-wrap",
            "clip-one-rank", "lr-off-by-one", "skip-step-one-rank", "layer-order",
            "load-on-rank0-after-wrap", "scaler-state-differs", "data-not-sharded")
COLUMNS = ("ddp", "ddp-detail", "hardened", "hardened-k1")
FAULT_STEP = 2
FAULTY_RANK = 1
LR = 1e-2
WIDTH = 32
BATCH = 16  # per rank


class MLP(nn.Module):
    """Four linear layers; the two hidden ones are registered in ``hidden_order``."""

    def __init__(self, hidden_order: tuple[str, str] = ("h1", "h2")) -> None:
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        for name in hidden_order:  # a user's set() iteration: order depends on PYTHONHASHSEED
            self.add_module(name, nn.Linear(WIDTH, WIDTH))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8) → (B, 1)
        x = F.relu(self.inp(x))
        x = F.relu(self.h1(x))
        x = F.relu(self.h2(x))
        return self.out(x)


def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard of global batch ``step`` (seeded: every run sees the same data)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH * world_size, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().double().numpy().tobytes())
    return h.hexdigest()[:16]


def wrap(model: nn.Module, column: str) -> tuple[DDP, Any]:
    """DDP as the column builds it, and what to close afterwards."""
    ddp = DDP(model)
    if column == "ddp-detail":
        dist.set_debug_level(dist.DebugLevel.DETAIL)
        group = dist.new_group(backend="gloo")  # created under DETAIL: fingerprint-checked
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
        return ddp, group
    if column == "hardened":
        return ddp, harden(ddp)  # the defaults: all a user adds
    if column == "hardened-k1":
        return ddp, harden(ddp, hardened_k1().harden)
    return ddp, None


def train(pattern: str, column: str, steps: int = SCRIPT_STEPS) -> dict:
    """The user's script (process group already up): the final parameter digest (rank 0's)
    and whether every rank holds the same parameters. A check that fires raises its
    ``ConsistencyError`` after every rank has left the run."""
    rank, world = dist.get_rank(), dist.get_world_size()
    one_rank = rank == FAULTY_RANK
    torch.manual_seed(0)
    order = ("h2", "h1") if pattern == "layer-order" and one_rank else ("h1", "h2")
    model = MLP(order)
    ddp, extra = None, None
    try:
        ddp, extra = wrap(model, column)
        if pattern == "convert-after-wrap":
            ddp.double()  # e.g. .cpu() and back to .cuda() around a faiss index build
            ddp.float()
        elif pattern == "param-replaced-after-wrap":
            model.h1.weight = nn.Parameter(model.h1.weight.detach().clone())
        elif pattern == "load-on-rank0-after-wrap" and rank == 0:
            g = torch.Generator().manual_seed(7)
            model.load_state_dict({k: v + 1e-2 * torch.randn(v.shape, generator=g)
                                   for k, v in model.state_dict().items()})
        opt = torch.optim.AdamW(ddp.parameters(), lr=LR)
        net = ddp.module if pattern == "forward-via-module" else ddp
        for step in range(steps):
            faulty = one_rank and step >= FAULT_STEP
            x, y = batch(step, 0 if pattern == "data-not-sharded" else rank, world)
            scale = 2.0 if pattern == "scaler-state-differs" and faulty else 1.0
            (F.mse_loss(net(x), y) * scale).backward()
            if scale != 1.0:  # this rank's GradScaler unscales by its own scale
                for p in model.parameters():
                    p.grad.div_(scale)
            if pattern == "clip-one-rank" and faulty:
                norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5 * float(norm))
            for group in opt.param_groups:  # a resumed scheduler one step behind on one rank
                group["lr"] = LR * (0.9 if pattern == "lr-off-by-one" and faulty else 1.0)
            if not (pattern == "skip-step-one-rank" and one_rank and step == FAULT_STEP):
                opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        _close(extra)
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    digests: list[str] = [""] * world
    dist.all_gather_object(digests, digest(model))
    return {"param_digest": digests[0], "replicas_equal": len(set(digests)) == 1}


def _close(extra: Any) -> None:
    if isinstance(extra, dist.ProcessGroup):
        dist.destroy_process_group(extra)
        dist.set_debug_level(dist.DebugLevel.OFF)
    elif extra is not None:
        extra.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", choices=PATTERNS, default="none")
    ap.add_argument("--column", choices=COLUMNS, default="hardened")
    ap.add_argument("--steps", type=int, default=SCRIPT_STEPS)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        result = {"outcome": "finished", **train(args.pattern, args.column, args.steps)}
    except ConsistencyError as exc:
        result = {"outcome": "detected", "kind": type(exc).__name__, "step": exc.step,
                  "ranks": exc.ranks, "params": exc.params, "detail": str(exc)[:300]}
    if dist.get_rank() == 0:
        line = json.dumps({"pattern": args.pattern, "column": args.column, **result})
        print(line, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
