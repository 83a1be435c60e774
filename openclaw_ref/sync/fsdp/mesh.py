"""Where an FSDP2 model's ranks and parameters sit, read from the placements — never guessed:
the group the guard's exchange spans, which ranks hold replicas of each parameter's shard, and
each parameter with its FSDP group's mixed-precision policy (what the start-up check compares).

The replica rule. A parameter's local values are equal, bitwise, on the ranks that hold the same
shard of it: the ranks of the exchange group with the same coordinates along the dims its
placements shard (``Shard``, FSDP2's ``_StridedShard``). Every other dim replicates it —
``Replicate()`` in its placements (HSDP's replicate dim, a norm under ``SequenceParallel``, a
bias under ``RowwiseParallel``) or a dim its mesh does not have at all (a parameter the TP plan
left out lives on the dp mesh only, and each tp rank holds its own copy). One rule for HSDP,
``replicate_with_fsdp`` and tensor parallelism: 2-D and 3-D meshes are the same case.

Which replicas FSDP2 itself keeps equal: those along the dims of its own mesh (its all-reduce
over HSDP's replicate dim). Replicas along any other dim (tp) are equal only by the model's
construction — a replicated DTensor's gradient all-reduced by DTensor, or a plain parameter
whose every tp rank saw the same activations — and that is where the published TP bugs live
(a sequence-parallel norm's gradient never reduced over tp). A ``Seat`` records both counts.

Invariant: a ``Seat``'s ``pattern`` is the same on every rank for the same parameter (mesh dim
names, sizes and placement kinds, no rank), and its ``key`` is equal on two ranks exactly when
they hold the same shard, so ranks can be grouped by (pattern, key) from the rows alone.
What cannot be read so — a ``Partial`` parameter, a mesh not inside the model's largest mesh —
is refused with ``BadInput`` before anything is registered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from openclaw_ref.sync.errors import BadInput


@dataclass(frozen=True)
class Seat:
    """Where one parameter's local shard sits (module docstring)."""

    pattern: str  # mesh dims, sizes and placement kinds: the same on every rank
    key: int  # 1 + this rank's coordinate along the shard dims (mixed radix)
    replicas: int  # ranks of the exchange group holding this shard (1: no replica)
    beyond: tuple[str, ...]  # dims it is replicated over that FSDP2 does not reduce over


def _mesh_ranks(mesh: DeviceMesh) -> list[int]:
    return mesh.mesh.flatten().tolist()


def model_mesh(model: nn.Module) -> DeviceMesh:
    """The largest mesh any parameter lives on (the (dp, tp) mesh, HSDP's, or the 1-D one);
    every other parameter's mesh must lie inside it (``BadInput`` naming the one that does
    not)."""
    meshes = [(n, p.device_mesh) for n, p in model.named_parameters() if isinstance(p, DTensor)]
    largest = max((m for _, m in meshes), key=lambda m: m.size())
    ranks = set(_mesh_ranks(largest))
    for name, mesh in meshes:
        if not set(_mesh_ranks(mesh)) <= ranks:
            raise BadInput(f"parameter {name} lives on a mesh of ranks {_mesh_ranks(mesh)} "
                           f"outside the model's largest mesh {sorted(ranks)}: harden() reads "
                           "which ranks hold replicas from one mesh and its sub-meshes; build "
                           "every mesh from one init_device_mesh")
    return largest


def exchange_group(model: nn.Module) -> dist.ProcessGroup:
    """The group spanning every rank of the model's meshes: the mesh's own group (1-D), the
    flattened mesh (2-D, 3-D), or the default group when the mesh is the whole world."""
    mesh = model_mesh(model)
    if mesh.ndim == 1:
        return mesh.get_group()
    if mesh.size() == dist.get_world_size():
        return dist.group.WORLD
    return mesh._flatten().get_group()


def _is_shard(placement: Placement) -> bool:
    return isinstance(placement, (Shard, _StridedShard))


def _dim_name(mesh: DeviceMesh, d: int) -> str:
    return mesh.mesh_dim_names[d] if mesh.mesh_dim_names else f"dim{d}"


def _check_placements(name: str, p: DTensor) -> None:
    for d, placement in enumerate(p.placements):
        if not (_is_shard(placement) or placement.is_replicate()):
            raise BadInput(f"parameter {name} has placement {placement} on mesh dim "
                           f"{_dim_name(p.device_mesh, d)}: harden() reads which ranks hold "
                           "replicas from Shard and Replicate placements only; a parameter "
                           "must not be Partial between optimizer steps")


def _fsdp_meshes(model: nn.Module) -> dict[int, DeviceMesh]:
    """id(sharded parameter) -> the mesh its FSDP group reduces over (shard and HSDP's
    replicate dims)."""
    out: dict[int, DeviceMesh] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    out[id(fsdp_param.sharded_param)] = group.mesh_info.mesh
    return out


def _coordinate_of(mesh: DeviceMesh, rank: int) -> tuple[int, ...] | None:
    where = (mesh.mesh == rank).nonzero()
    return tuple(where[0].tolist()) if len(where) else None


def seat_of(name: str, p: DTensor, group_mesh: DeviceMesh, fsdp_mesh: DeviceMesh | None
            ) -> Seat:
    """``p``'s seat on this rank (module docstring). ``group_mesh``: the model's largest mesh;
    ``fsdp_mesh``: the mesh p's FSDP group reduces over (None: FSDP2 does not manage it)."""
    _check_placements(name, p)
    mesh, placements = p.device_mesh, p.placements
    shard = [d for d, pl in enumerate(placements) if _is_shard(pl)]
    mine = mesh.get_coordinate()
    key = 0
    for d in shard:
        key = key * mesh.size(d) + mine[d]
    kinds = ",".join(f"{_dim_name(mesh, d)}:{mesh.size(d)}={'S' if d in shard else 'R'}"
                     for d in range(mesh.ndim))
    replicas = group_mesh.size() // math.prod(mesh.size(d) for d in shard)
    within = 1
    if fsdp_mesh is not None:
        coords = [_coordinate_of(mesh, q) for q in _mesh_ranks(fsdp_mesh)]
        within = sum(c is not None and all(c[d] == mine[d] for d in shard) for c in coords)
    beyond: tuple[str, ...] = ()
    if replicas > within:
        fsdp_names = set(fsdp_mesh.mesh_dim_names or ()) if fsdp_mesh is not None else set()
        names = [_dim_name(mesh, d) for d, pl in enumerate(placements)
                 if pl.is_replicate() and _dim_name(mesh, d) not in fsdp_names]
        own = {_dim_name(mesh, d) for d in range(mesh.ndim)}
        names += [_dim_name(group_mesh, d) for d in range(group_mesh.ndim)
                  if _dim_name(group_mesh, d) not in own]
        beyond = tuple(names) or ("a dim outside FSDP2's mesh",)
    return Seat(kinds, key + 1, replicas, beyond)


def seats(model: nn.Module, tracked: list[tuple[str, torch.Tensor]]) -> list[Seat]:
    """Every tracked parameter's seat on this rank, in ``tracked``'s order. Local: no
    collective, so ``harden()`` reads (and refuses) the mesh before anything else. Parameters
    with the same pattern must sit on the same shard coordinate (the replica check groups them
    into one class): ``BadInput`` naming two that do not."""
    group_mesh = model_mesh(model)
    fsdp = _fsdp_meshes(model)
    out = [seat_of(n, p, group_mesh, fsdp.get(id(p))) for n, p in tracked]
    first: dict[str, int] = {}
    for i, seat in enumerate(out):
        j = first.setdefault(seat.pattern, i)
        if out[j].key != seat.key:
            raise BadInput(f"parameters {tracked[j][0]} and {tracked[i][0]} have the same "
                           f"placements ({seat.pattern}) on different meshes of this rank: "
                           "harden() cannot tell which ranks hold their replicas; build their "
                           "meshes as slices of one init_device_mesh")
    return out


def tensor_parallel_dims(model: nn.Module) -> tuple[str, ...]:
    """The dims of the parameters' meshes that FSDP2 does not own (tp): empty for 1-D FSDP2,
    HSDP and ``replicate_with_fsdp``. A dim is FSDP2's when every rank along it from this one
    is in the mesh its FSDP group reduces over (ranks, so unnamed meshes are read too)."""
    fsdp = _fsdp_meshes(model)
    out: list[str] = []
    for _, p in model.named_parameters():
        if not isinstance(p, DTensor):
            continue
        owned = fsdp.get(id(p))
        owned_ranks = set(_mesh_ranks(owned)) if owned is not None else set()
        for d in range(p.device_mesh.ndim):
            along = {q for q in _mesh_ranks(p.device_mesh)
                     if _same_except(p.device_mesh, q, d)}
            name = _dim_name(p.device_mesh, d)
            if not along <= owned_ranks and name not in out:
                out.append(name)
    return tuple(out)


def _same_except(mesh: DeviceMesh, rank: int, dim: int) -> bool:
    """Whether ``rank`` differs from this rank only along ``dim`` of ``mesh``."""
    theirs, mine = _coordinate_of(mesh, rank), mesh.get_coordinate()
    return theirs is not None and all(a == b for i, (a, b) in enumerate(zip(theirs, mine))
                                      if i != dim)


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
