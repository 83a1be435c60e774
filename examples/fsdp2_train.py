"""An FSDP2 (fully_shard) training script guarded by harden(): copy it, put your model in.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_train.py

Tested on CPU with gloo (2 ranks, CI); not yet run on a GPU. Call harden() after the last
fully_shard; the step's checks run in the optimizer step's pre-hook, before it applies anything.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from openclaw_ref.sync import harden


def train(steps: int = 20) -> None:
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # HSDP: a (replicate, shard) mesh
    torch.manual_seed(0)  # FSDP2 does not broadcast: build the same model on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    guard = harden(model)  # after the last fully_shard
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after fully_shard: the DTensors
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    for _ in range(steps):
        x = torch.randn(16, 32, generator=data)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        opt.step()  # a disagreement between ranks raises here, before the update, on every rank
        opt.zero_grad()
    guard.close()
    if rank == 0:
        print(f"loss {loss.item():.4f}, {guard.summary()['checks_passed']} checks passed")


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    train()
    dist.destroy_process_group()
