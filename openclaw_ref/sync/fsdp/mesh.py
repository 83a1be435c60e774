"""Where an FSDP2 model's ranks and parameters sit: the group the guard's exchange spans, which
ranks hold replicas of the same shards (HSDP's replicate dimension, ``replicate_with_fsdp``), and
each parameter with its FSDP group's mixed-precision policy (what the start-up check compares)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def _mesh(model: nn.Module) -> DeviceMesh:
    return next(p.device_mesh for p in model.parameters() if isinstance(p, DTensor))


def replica_coordinate(model: nn.Module) -> int:
    """1 + this rank's position among the shards (ranks with the same number hold replicas of
    the same shard), or 0 when no shard has a replica: replicas exist along the mesh dims whose
    placement is ``Replicate`` (HSDP's dim 0; ``replicate_with_fsdp``'s only dim), the shard
    index is the coordinate along the ``Shard`` dims (none under ``replicate_with_fsdp``: every
    rank holds the whole parameter, all replicas of one another)."""
    p = next(p for p in model.parameters() if isinstance(p, DTensor))
    mesh, coordinate = p.device_mesh, p.device_mesh.get_coordinate()
    replicated = [d for d, pl in enumerate(p.placements) if pl.is_replicate()]
    if not any(mesh.size(d) > 1 for d in replicated):
        return 0
    shard = 0
    for d in range(mesh.ndim):
        if d not in replicated:
            shard = shard * mesh.size(d) + coordinate[d]
    return shard + 1


def exchange_group(model: nn.Module) -> dist.ProcessGroup:
    """The group spanning every rank of the model's mesh: the mesh's own group (1-D), the
    flattened mesh (2-D, HSDP), or the default group when the mesh is the whole world."""
    mesh = _mesh(model)
    if mesh.ndim == 1:
        return mesh.get_group()
    if mesh.size() == dist.get_world_size():
        return dist.group.WORLD
    return mesh._flatten().get_group()


def policy_manifest(model: nn.Module, tracked: list[tuple[str, torch.Tensor]]
                ) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) for the start-up check, each name carrying its FSDP group's
    ``MixedPrecisionPolicy``: a policy that differs on one rank gives that rank all-gathers
    of another size, which gloo answers by aborting the process at the first forward."""
    policy = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    policy[id(fsdp_param.sharded_param)] = _policy_text(group.mp_policy)
    return [(f"{n} [{policy.get(id(p), '?')}]", p) for n, p in tracked]


def _policy_text(mp) -> str:
    return ",".join(f"{k}={getattr(mp, k)}" for k in
                    ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"))
