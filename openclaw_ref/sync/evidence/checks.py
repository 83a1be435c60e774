"""Rank-consistency checks that compare what every rank holds.

Each check returns or raises a ``ConsistencyError`` subclass naming the step, the parameters
and the ranks that disagree. "Equal" always means bitwise equal: the replica check uses a
64-bit checksum computed on the parameters' own device by ``replica_digest.ReplicaDigest`` and
compared with tensor collectives (see its collision argument). The start-up check compares a
16-byte BLAKE2b digest of each rank's parameter manifest and bucket layout first (one tensor
gather of 16 bytes per rank) and exchanges the manifests themselves only when the digests
differ. ``gather_rows`` and ``collective_device`` are the one tensor gather every check of the
library uses (nothing is pickled or unpickled).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable

import torch
from torch import nn

from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ConsistencyError,
    ParameterMismatch,
    ReplicaDivergence,
)
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest
from openclaw_ref.sync.evidence.vote import majority, split_view, tie_caveat

# ---------------------------------------------------------------------------------------------
# Tensor collectives shared by the cross-rank checks: nothing is pickled or unpickled.


def collective_device(group, device: torch.device) -> torch.device:
    """Where this group's collectives take tensors: gloo → CPU, NCCL → the current GPU."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if device.type in backend or (device.type == "cuda" and "nccl" in backend):
        return device  # e.g. "cpu:gloo,cuda:nccl", or NCCL with CUDA parameters
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return device


# The tensor all-gather the cross-rank checks use (torch 2.13 deprecates all_gather_into_tensor).
GATHER = ("all_gather_single" if hasattr(torch.distributed, "all_gather_single")
          else "all_gather_into_tensor")


def gather_rows(local: torch.Tensor, group) -> torch.Tensor:
    """Every rank's copy of ``local`` (1-D, the same size on every rank) as rows, in rank
    order; one ``GATHER``."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    out = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device)
    gather = getattr(dist, GATHER)
    gather(out, local, group=group)
    return out.view(world, local.numel())


def _all_gather(local: torch.Tensor, group) -> list[list[int]]:
    """Every rank's copy of ``local`` (1-D), in rank order; one host read."""
    return gather_rows(local, group).tolist()


def _all_gather_bytes(raw: bytes, group, device: torch.device) -> list[bytes]:
    """Every rank's ``raw`` in rank order, through two tensor gathers (the lengths, then the
    bytes padded to the longest); what comes back is bytes, never an unpickled object."""
    length = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    lengths = [n for (n,) in _all_gather(length, group)]
    local = torch.zeros(max(lengths), dtype=torch.uint8)
    local[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    rows = gather_rows(local.to(device), group).cpu()
    return [rows[r, :n].numpy().tobytes() for r, n in enumerate(lengths)]


# ---------------------------------------------------------------------------------------------
# Cross-rank checks (hardened sync). Each decides only from gathered values, which are identical
# on every rank, so every rank takes the same branch and raises the same error or none does. The
# reference is the value most ranks hold (ties: the lowest rank's); the named ranks are the
# others; a message claims a majority only where there is one (``control.split_view``).

Manifest = list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype) in registration order


def parameter_manifest(named: Iterable[tuple[str, torch.Tensor]]) -> Manifest:
    return [(name, tuple(p.shape), str(p.dtype)) for name, p in named]


DIGEST_BYTES = 16  # one start-up digest per rank


def encode_manifest(manifest: Manifest, layout: list[int] | None = None) -> bytes:
    """The canonical encoding of a manifest and a bucket layout: compact ASCII JSON of
    ``[[[name, shape, dtype], …], layout]`` — one byte string per value, and back by
    ``decode_manifest`` (JSON, never pickle: it is read from the network)."""
    entries = [[name, list(shape), dtype] for name, shape, dtype in manifest]
    return json.dumps([entries, layout], separators=(",", ":")).encode()


def decode_manifest(raw: bytes) -> tuple[Manifest, list[int] | None]:
    entries, layout = json.loads(raw.decode())
    return [(name, tuple(shape), dtype) for name, shape, dtype in entries], layout


def manifest_digest(manifest: Manifest, layout: list[int] | None = None) -> bytes:
    """BLAKE2b (``DIGEST_BYTES`` bytes) of ``encode_manifest``. Equal manifests and layouts give
    equal digests; different ones collide with probability 2^-128 per pair of ranks, so a
    mismatch anywhere among W ranks goes unseen with probability at most W²/2^129 (2^-103 at
    8,192 ranks)."""
    return hashlib.blake2b(encode_manifest(manifest, layout), digest_size=DIGEST_BYTES).digest()


def _first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_manifests(manifests: list[Manifest], *, step: int | None = None,
                      error: type[ConsistencyError] | None = None) -> None:
    """Raise ``error`` (default ``ParameterMismatch``) naming the first entry where a rank's
    manifest differs from the reference, and every rank that differs anywhere."""
    error = error or ParameterMismatch
    digests = [manifest_digest(m) for m in manifests]
    vote = majority(digests)
    ref_digest, off = vote.reference, vote.differing
    if not off:
        return
    ref_rank = digests.index(ref_digest)
    ref = manifests[ref_rank]
    first = min((r for r in off if r != ref_rank),
                key=lambda r: _first_difference(ref, manifests[r]))
    i = _first_difference(ref, manifests[first])

    def entry(m: Manifest) -> str:
        return "(absent)" if i >= len(m) else f"{m[i][0]} {list(m[i][1])} {m[i][2]}"

    names = sorted({m[i][0] for m in (ref, manifests[first]) if i < len(m)})
    raise error(f"entry #{i}: rank {ref_rank} has {entry(ref)}, rank {first} has "
                f"{entry(manifests[first])} ({len(manifests)} ranks compared){tie_caveat(vote)}",
                step=step, ranks=off, params=names)


def construction_check(named: Iterable[tuple[str, torch.Tensor]], group=None,
                       layout: list[int] | None = None) -> None:
    """Parameter names, shapes, dtypes and ORDER agree on all ranks.

    DDP's own construction check compares parameters by index and shape only, so two
    same-shaped parameters registered in swapped order on one rank pass it silently — and then
    each is averaged with the *other* parameter of the other ranks. This one compares names too.
    ``layout`` (e.g. DDP's bucket sizes) is compared too: a rank with another bucket cap would
    otherwise reach gloo with a different allreduce size, which aborts the process (SIGABRT)
    instead of raising — here it is a ``BucketMisalignment`` naming the rank.

    Cost: one tensor all-gather (``GATHER``) of the ``DIGEST_BYTES`` digest of manifest and
    layout per rank. Only when the digests differ, two more (lengths, then the encoded
    manifests, zlib-compressed and padded) bring every rank's manifest and layout to be compared
    and named."""
    mine = parameter_manifest(named)
    device = collective_device(group, torch.device("cpu"))
    digest = torch.frombuffer(bytearray(manifest_digest(mine, layout)), dtype=torch.uint8)
    if len({tuple(row) for row in _all_gather(digest.to(device), group)}) == 1:
        return
    packed = zlib.compress(encode_manifest(mine, layout))
    gathered = [decode_manifest(zlib.decompress(raw))
                for raw in _all_gather_bytes(packed, group, device)]
    compare_manifests([m for m, _ in gathered])
    layouts = [tuple(lay) if lay is not None else None for _, lay in gathered]
    vote = majority(layouts)
    off = vote.differing
    if off:
        split = split_view(layouts, vote, show=lambda lay: f"{len(lay or ())} buckets "
                                                          f"{list(lay or ())[:8]}")
        raise BucketMisalignment(
            f"bucket layouts differ at construction (bucket sizes in bytes): {split}",
            ranks=off)


# ---------------------------------------------------------------------------------------------
# The replica check: a 64-bit checksum per parameter computed on its own device
# (``replica_digest.ReplicaDigest``: the formula and its collision argument are there), compared
# across ranks with tensor collectives (16 bytes per rank when the replicas agree).


def replica_check(named: Iterable[tuple[str, torch.Tensor]], *, step: int, group=None,
                  digest: ReplicaDigest | None = None) -> None:
    """Every parameter bitwise-compared across the ranks of ``group`` through its device digest
    (see the collision argument in ``replica_digest``); ``ReplicaDivergence`` names every
    diverged parameter and the group-local ranks that hold something else than most ranks
    (ties: the lowest rank's value is the reference).

    ``digest`` is the caller's ``ReplicaDigest``, so that a check every K steps reuses its
    tables, scratch and plans; without one a fresh instance serves this call only (the same
    digests, rebuilt tables).

    Cost: one tensor all-gather (``GATHER``) of two int64 per rank (the combined digest and the
    parameter count); only when the combined digests disagree, a second one of the P-long
    digest vectors names the parameters. Both decisions come from gathered values, so every
    rank takes the same branch. A rank with another parameter count raises
    ``ParameterMismatch`` instead of reaching gloo with a mismatched size (which aborts)."""
    named = list(named)
    names = [n for n, _ in named]
    digest = digest if digest is not None else ReplicaDigest()
    digests = digest.digests([p for _, p in named])
    local = digests.to(collective_device(group, digests.device))
    count = torch.tensor([len(names)], dtype=torch.int64, device=local.device)
    heads = _all_gather(torch.cat([ReplicaDigest.combine(local).reshape(1), count]), group)
    counts = [c for _, c in heads]
    vote = majority(counts)
    off = vote.differing
    if off:
        split = split_view(counts, vote, show=lambda c: f"{c} parameters")
        raise ParameterMismatch(f"replica check over different parameter counts: {split}",
                                step=step, ranks=off)
    if not majority([c for c, _ in heads]).differing:
        return
    table = _all_gather(local, group)
    diverged: list[str] = []
    ranks: set[int] = set()
    for i, name in enumerate(names):
        odd = majority([row[i] for row in table]).differing
        if odd:
            diverged.append(name)
            ranks.update(odd)
    raise ReplicaDivergence(f"{len(diverged)} parameter(s) differ bitwise across ranks",
                            step=step, ranks=sorted(ranks), params=diverged)


def synchronized_parameters(ddp_model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters a ``DistributedDataParallel`` model keeps equal on every rank, named
    relative to ``ddp_model.module``, in registration order (shared parameters once).

    Skipped: the names in ``ddp_model.parameters_to_ignore`` — DDP's copy of
    ``module._ddp_params_and_buffers_to_ignore`` — which DDP neither broadcasts nor reduces,
    so they may differ legitimately. Kept: parameters DDP ignores only to reduce them later
    (``delay_all_reduce_named_params``: broadcast at construction, reduced by their own hook),
    and frozen (``requires_grad=False``) parameters: DDP broadcasts them at construction
    (``_sync_module_states`` skips only the ignored names) and nothing ever updates them, so a
    rank whose frozen weight differs computes another forward than the others — exactly the
    silent divergence this check exists for. A plain module (no DDP) is read the same way
    through its ``_ddp_params_and_buffers_to_ignore``."""
    module = getattr(ddp_model, "module", ddp_model)
    ignore = getattr(ddp_model, "parameters_to_ignore", None)
    if ignore is None:
        ignore = getattr(module, "_ddp_params_and_buffers_to_ignore", ())
    delayed = {id(p) for p in getattr(ddp_model, "_delay_all_reduce_params", ())}
    return [(n, p) for n, p in module.named_parameters()
            if n not in ignore or id(p) in delayed]


def required_gradient_names(module: nn.Module) -> set[str] | None:
    """Names (relative to ``module``) of parameters that must get a gradient every step.

    A submodule that implements ``conditional_parameter_names()`` (the sparse-gradient
    contract) declares which of its parameters may go without; every other parameter of such a
    submodule is required. Without any declaration nothing is required (None): presence cannot
    be judged, and absence is then never an error.
    """
    required: set[str] | None = None
    for prefix, sub in module.named_modules():
        declare = getattr(sub, "conditional_parameter_names", None)
        if not callable(declare):
            continue
        base = f"{prefix}." if prefix else ""
        optional = set(declare())
        mine = {f"{base}{n}" for n, _ in sub.named_parameters() if n not in optional}
        required = (required or set()) | mine
    return required
