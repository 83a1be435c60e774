"""A plain user script under torchrun: DDP, ``harden(ddp)`` with its defaults alone (the canary
on, every ``CANARY_EVERY`` steps: its first probe at step 1), an ordinary loop — plus, for the
tests, the emulated GPU noise on every rank (``--noise RATE``) or one rank's faulty matmuls
(``--fault NAME --fault-rank R``). Every rank writes what it raised and recorded to
``<out>/rank<R>.json``. Run: ``torchrun --nproc-per-node 2 -m tests.canary_user_script
--noise 1``."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from contextlib import ExitStack

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.nondeterminism import NoisyKernels
from openclaw_ref.core.sdc_faults import FaultyMatmul, sdc_model
from openclaw_ref.experiments.canary_confirm import ConfirmNet, confirm_batch
from openclaw_ref.sync import ConsistencyError, harden


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--fault", default="")
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--out", default=".", help="each rank writes <out>/rank<R>.json")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ConfirmNet()
    ddp = DDP(model)
    state = harden(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    reply = {"rank": rank, "error": None, "ranks": None, "step": None}
    with ExitStack() as stack:
        if a.noise:
            stack.enter_context(NoisyKernels(a.noise, seed=1 + rank + 1000 * os.getpid()))
        if a.fault and rank == a.fault_rank:
            faulty = FaultyMatmul(sdc_model(a.fault, ""))
            faulty.active = True
            stack.enter_context(faulty)
        try:
            for step in range(a.steps):
                x, y = confirm_batch(step, rank)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()
        except ConsistencyError as exc:
            reply.update(error=exc.kind, ranks=exc.ranks, step=exc.step, message=str(exc))
    reply["canary"] = state.summary()["canary"]
    reply["events"] = [[str(e.kind), e.ranks] for e in state.events]
    state.close(verify=reply["error"] is None)
    with open(os.path.join(a.out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(reply, f)
    del ddp, state  # before exit: the gloo teardown deadlock (torch facts)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
