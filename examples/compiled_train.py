"""A torch.compile'd model under DDP and harden(): compile first, then wrap (nanoGPT's order).

    torchrun --standalone --nproc-per-node 2 examples/compiled_train.py

Tested on CPU with gloo (2 ranks, CI; inductor needs a C++ compiler); not yet run on a GPU.
DDP's DDPOptimizer splits the compiled graph at its bucket boundaries; harden() keeps DDP's own
reduction, adds no graph break and no recompile, and trains bitwise like the same script
without it (docs/setups.md, "torch.compile"). Compiled autograd is refused (BadInput).
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync import harden


def train(steps: int = 20) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                          nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1))
    # 1 MB buckets (DDP's first is 1 MB; DDPOptimizer asserts no later one is smaller): the
    # 2 MB of parameters make 3 buckets, so the compiled graph is split into 3
    ddp = DDP(torch.compile(model), bucket_cap_mb=1)
    state = harden(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=data)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        opt.step()
        opt.zero_grad()
    state.close()
    if rank == 0:
        print(f"loss {loss.item():.4f}, {state.summary()['checks_passed']} checks passed")


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    train()
    dist.destroy_process_group()
