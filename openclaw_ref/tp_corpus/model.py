"""The TP corpus's user code: a 2-block model (LayerNorm → Linear → ReLU → Linear, with a
residual) split over ``tp`` the way torchtitan splits a transformer, then ``fully_shard`` over
the data-parallel dims; its data, loss and the three ways to clip it.

Order as torchtitan's: ``parallelize_module`` on the tp mesh, ``torch.compile`` on each block
(``Module.compile``: the names of the parameters stay), ``fully_shard`` on each block and the
root. Parameters the plan covers become DTensors on the whole mesh; a parameter the plan leaves
out is a DTensor on the data-parallel mesh only, replicated over tp by nothing but the user's
care (/work/shared/torch-facts.md, "Meshes and the DDP object").
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from openclaw_ref.tp_corpus.cases import MeshShape, Plan

WIDTH, HIDDEN, FEATURES, CLASSES = 16, 32, 8, 16
SEQ = 8  # sequence length: a multiple of tp
BATCH = 4  # sequences per data-parallel rank


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.w1 = nn.Linear(WIDTH, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.relu(self.w1(self.norm(x))))


class Net(nn.Module):
    """(batch, SEQ, FEATURES) inputs and (batch, SEQ) class targets → the mean cross-entropy
    (``inp`` plays the embedding). The loss is computed inside, as many models do when given
    labels: logits returned from the FSDP2 root are a view of the TP head's output, on which
    FSDP2 warns on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(self.norm(h)).flatten(0, 1), y.flatten())


def build_mesh(shape: MeshShape) -> DeviceMesh:
    if shape is MeshShape.TWO_D:
        return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    return init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("replicate", "shard", "tp"))


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dims ``fully_shard`` gets: ``dp``, or HSDP's ``(replicate, shard)``."""
    names = tuple(n for n in mesh.mesh_dim_names if n != "tp")
    return mesh[names[0]] if len(names) == 1 else mesh[names]


def data_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's data-parallel index and the data-parallel size: every tp rank of one
    data-parallel group reads the same batch."""
    dp = data_parallel_mesh(mesh)
    coords, sizes = dp.get_coordinate(), dp.shape
    index = 0
    for c, n in zip(coords, sizes, strict=True):
        index = index * n + c
    return index, dp.size()


def parallelize(model: Net, tp: DeviceMesh, plan: Plan) -> None:
    """``plan``'s TP split (``Plan``): sequence parallel as torchtitan's Llama (the input
    projection scatters the sequence, the norms run on sequence shards, ``w1`` gathers it,
    ``w2`` reduce-scatters it), or the plain plan (only the Linears split, activations
    replicated)."""
    if plan is Plan.PLAIN:
        parallelize_module(model, tp, {"head": ColwiseParallel(output_layouts=Replicate())})
        for block in model.blocks:
            parallelize_module(block, tp, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        return
    norms = plan is not Plan.SP_WITHOUT_NORMS
    logits_sharded = plan is Plan.LOSS_PARALLEL
    parallelize_module(model, tp, {
        "inp": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        **({"norm": SequenceParallel()} if norms else {}),
        "head": ColwiseParallel(input_layouts=Shard(1),
                                output_layouts=Shard(-1) if logits_sharded else Replicate(),
                                use_local_output=not logits_sharded)})
    for block in model.blocks:
        parallelize_module(block, tp, {
            **({"norm": SequenceParallel()} if norms else {}),
            "w1": ColwiseParallel(input_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1))})


def shard(model: Net, mesh: DeviceMesh, compiled: bool) -> None:
    dp = data_parallel_mesh(mesh)
    for block in model.blocks:
        if compiled:
            block.compile()
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)


def build(shape: MeshShape, plan: Plan, compiled: bool) -> tuple[Net, DeviceMesh]:
    """The user's model on ``shape``, the same on every rank (seeded), split and sharded."""
    mesh = build_mesh(shape)
    torch.manual_seed(0)
    model = Net()
    parallelize(model, mesh["tp"], plan)
    shard(model, mesh, compiled)
    return model, mesh


def batch(step: int, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Part ``index`` of ``size`` of global batch ``step`` (seeded: every run sees the same
    data): inputs and class targets."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH * size, SEQ, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (BATCH * size, SEQ), generator=g)
    return x[index * BATCH:(index + 1) * BATCH], y[index * BATCH:(index + 1) * BATCH]


def forward_backward(model: Net, x: torch.Tensor, y: torch.Tensor, plan: Plan) -> None:
    """One micro-batch's forward and backward; under loss parallel both in its context (the
    logits stay sharded by class)."""
    with loss_parallel() if plan is Plan.LOSS_PARALLEL else contextlib.nullcontext():
        model(x, y).backward()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


@torch.no_grad()
def clip_per_mesh(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The recipe for parameters on several meshes (torchtitan's ``_clip_grad_norm_with_ep``,
    torchtitan/distributed/utils.py): each mesh's norm (a DTensor, reduced over the mesh's
    shard dims by ``full_tensor``: replicated copies count once), the p-norms combined, every
    group clipped by the total. ``torch.nn.utils.clip_grad_norm_`` raises on two meshes."""
    by_mesh: dict[DeviceMesh, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh, []).append(p)
    norms = [torch.nn.utils.get_total_norm([p.grad for p in ps]).full_tensor()
             for ps in by_mesh.values()]
    total = torch.stack(norms).pow(2).sum().sqrt()
    for ps in by_mesh.values():  # the parameters, not their gradients: clip reads p.grad
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)
    return total


@torch.no_grad()
def clip_world_sum(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The mistake: every rank's local squares summed over the world, as if every parameter
    were sharded — a tp-replicated one counts tp times. One factor, the same everywhere."""
    local = [g.to_local() for g in _grads(model)]
    squares = torch.stack([t.pow(2).sum() for t in local]).sum()
    dist.all_reduce(squares)
    total = squares.sqrt()
    torch._foreach_mul_(local, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total
