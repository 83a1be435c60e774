"""FSDP2 x tensor parallel (2-D, sequence parallel) guarded by harden(): copy it, put your model in.

    torchrun --standalone --nproc-per-node 4 examples/fsdp2_tp_train.py

Tested on CPU with gloo (4 ranks: dp=2 x tp=2, CI); not yet run on a GPU. The order is
torchtitan's: parallelize_module over the tp mesh, fully_shard over the dp mesh, then
harden(model) after the last fully_shard. Two rules harden() cannot keep for you: every tp
rank of one dp group reads the same batch (seed the loader with the dp rank, not the global
rank), and gradients are clipped with the norm per mesh (docs/meshes.md) —
torch.nn.utils.clip_grad_norm_ raises on parameters of two meshes.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from openclaw_ref.sync import harden

WIDTH, CLASSES, SEQ = 32, 16, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.w1, self.w2 = nn.Linear(WIDTH, 64), nn.Linear(64, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.relu(self.w1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, SEQ, 8) -> logits (B, SEQ, CLASSES)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def parallelize(model: Net, tp) -> None:
    """Sequence parallel: the norms run on sequence shards (their weights Replicate over tp),
    w1 gathers the sequence, w2 reduce-scatters it, the logits stay sharded by class."""
    parallelize_module(model, tp, {
        "inp": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                use_local_output=False)})
    for block in model.blocks:
        parallelize_module(block, tp, {"norm": SequenceParallel(),
                                       "w1": ColwiseParallel(input_layouts=Shard(1)),
                                       "w2": RowwiseParallel(output_layouts=Shard(1))})


def train(steps: int = 20) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)  # the same model on every rank
    model = Net()
    parallelize(model, mesh["tp"])
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    guard = harden(model)  # after the last fully_shard
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    data = torch.Generator().manual_seed(1 + dp_rank)  # by dp rank: the tp peers read alike
    for _ in range(steps):
        x = torch.randn(4, SEQ, 8, generator=data)
        y = torch.randint(0, CLASSES, (4, SEQ), generator=data)
        with loss_parallel():  # the loss over class-sharded logits, and its backward
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        opt.step()  # a disagreement between ranks raises here, before the update, on every rank
        opt.zero_grad()
    guard.close()
    if dist.get_rank() == 0:
        passed = guard.summary()["checks_passed"]
        print(f"loss {loss.full_tensor().item():.4f}, {passed} checks passed")


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    train()
    dist.destroy_process_group()
