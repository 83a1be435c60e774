"""A DDP training script guarded by harden(): copy it, put your model and data in.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py

Tested on CPU with gloo (2 ranks, CI); on GPUs use "nccl", one device per rank — not yet run on a
GPU. A rank whose gradients, step or replica disagrees with the others raises on every rank.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync import harden


def train(steps: int = 20) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)  # any init: DDP broadcasts rank 0's parameters
    ddp = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    state = harden(ddp)  # refuses (BadInput) before it changes anything, or guards every step
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    for _ in range(steps):
        x = torch.randn(16, 32, generator=data)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        loss.backward()  # a disagreement between ranks raises here, on every rank
        opt.step()
        opt.zero_grad()
    state.close()  # every parameter compared across ranks once more; the hooks removed
    if rank == 0:
        print(f"loss {loss.item():.4f}, {state.summary()['checks_passed']} checks passed")


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))  # torchrun's RANK, WORLD_SIZE
    train()  # returns with the DDP model freed, before the process group goes
    dist.destroy_process_group()
