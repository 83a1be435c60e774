"""The TP corpus's cases: healthy FSDP2 × tensor-parallel set-ups and the published TP/SP
mistakes, each with its public source, and the knobs the script (``script``) reads to build it.

A case is one user script: a mesh shape, a TP plan, a clipping recipe, one mistake or none.
A mistake is either in every rank's code (the plan, the clipping, the data loader) or acts on
``FAULT_RANK`` alone (its lr, a weight, an extra micro-batch), from ``FAULT_STEP``. Each mistake
names its ``base``: the healthy case it differs from, the run it is judged against. Where no
public report of the exact mistake was found, ``source`` says so and ``url`` is None; ``note``
names the closest public context, never a stand-in citation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from openclaw_ref.sync.errors import BadInput

FAULT_RANK = 1  # a one-rank mistake acts on global rank 1: (dp 0, tp 1) on the 2-D mesh
FAULT_STEP = 0  # the step a one-rank mistake acts on (the weight: changed before it)
NOT_FOUND = "no public report found"


class MeshShape(enum.StrEnum):
    """The device meshes of the corpus; the TP dim is always ``tp``, of size 2."""

    TWO_D = "dp2-tp2"  # (dp=2, tp=2): FSDP2 over dp, 4 ranks
    THREE_D = "replicate2-shard2-tp2"  # HSDP × TP: FSDP2 over (replicate, shard), 8 ranks

    @property
    def world_size(self) -> int:
        return 4 if self is MeshShape.TWO_D else 8


class Plan(enum.StrEnum):
    """How the blocks are split over tp (``model.parallelize``)."""

    SEQUENCE_PARALLEL = "sequence-parallel"  # norms under SequenceParallel, activations Shard(1)
    SP_WITHOUT_NORMS = "sp-without-norms"  # the same, the norms left out of the plan
    PLAIN = "plain"  # activations replicated over tp, norms plain parameters
    LOSS_PARALLEL = "loss-parallel"  # sequence parallel, the head's logits sharded by class


class Clip(enum.StrEnum):
    NONE = "none"
    PER_MESH = "per-mesh"  # the norm per mesh, combined (torchtitan's recipe): right
    LOCAL = "local"  # each rank by the norm of its local gradients alone
    WORLD_SUM = "world-sum"  # local squares summed over every rank: tp-replicated ones tp×


class Fault(enum.StrEnum):
    NONE = "none"
    LOADER_BY_GLOBAL_RANK = "loader-by-global-rank"  # each rank its own batch, tp peers too
    LR_ONE_RANK = "lr-one-rank"  # FAULT_RANK's lr × LR_FACTOR
    WEIGHT_ONE_RANK = "weight-one-rank"  # FAULT_RANK's copy of a tp-replicated norm changed
    EXTRA_MICROBATCH = "extra-microbatch"  # FAULT_RANK runs one more forward/backward


@dataclass(frozen=True)
class Case:
    """One user script: its name (the table's row), mesh, plan, clipping, mistake, whether
    its blocks are compiled, the healthy case it differs from (None: healthy), its source."""

    name: str
    mesh: MeshShape
    plan: Plan
    clip: Clip = Clip.NONE
    fault: Fault = Fault.NONE
    compiled: bool = False
    base: str | None = None
    source: str | None = None
    url: str | None = None
    note: str = ""

    @property
    def healthy(self) -> bool:
        return self.base is None


def _mistake(name: str, plan: Plan, base: str, source: str, url: str | None, note: str,
             **knobs) -> Case:
    return Case(name, knobs.pop("mesh", MeshShape.TWO_D), plan, base=base, source=source,
                url=url, note=note, **knobs)


HEALTHY: tuple[Case, ...] = (
    Case("sequence-parallel", MeshShape.TWO_D, Plan.SEQUENCE_PARALLEL),
    Case("plain-tp", MeshShape.TWO_D, Plan.PLAIN),
    Case("loss-parallel", MeshShape.TWO_D, Plan.LOSS_PARALLEL),
    Case("compiled-blocks", MeshShape.TWO_D, Plan.SEQUENCE_PARALLEL, compiled=True),
    Case("clip-per-mesh", MeshShape.TWO_D, Plan.PLAIN, clip=Clip.PER_MESH),
    Case("hsdp-tp-3d", MeshShape.THREE_D, Plan.SEQUENCE_PARALLEL),
)
MISTAKES: tuple[Case, ...] = (
    _mistake("norms-left-out-of-sp", Plan.SP_WITHOUT_NORMS, "sequence-parallel",
             "Megatron-LM#1446",
             "https://github.com/NVIDIA/Megatron-LM/issues/1446",
             "norm gradients differ across TP ranks under TP+SP; also TransformerEngine#441 "
             "(norm weights differ across TP ranks after a step), gpt-neox#1257 (loss flat "
             "near 8 until the norms' gradients were all-reduced over TP), NeMo-RL#3716 (a "
             "train step missing the TP all-reduce of replicated parameters)"),
    _mistake("loader-by-global-rank", Plan.PLAIN, "plain-tp", "DeepSpeed#99",
             "https://github.com/deepspeedai/DeepSpeed/issues/99",
             "DistributedSampler reads the global rank and world size under model "
             "parallelism; torchtitan#49 made the TP ranks of one dp rank read the same data",
             fault=Fault.LOADER_BY_GLOBAL_RANK),
    _mistake("lr-one-rank", Plan.SEQUENCE_PARALLEL, "sequence-parallel", "Lightning#4655",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/4655",
             "a DDP report (scheduler state differs on one rank); under TP the lr acts on that "
             "rank's shards and on its copy of every tp-replicated parameter",
             fault=Fault.LR_ONE_RANK),
    _mistake("clip-local-norm", Plan.PLAIN, "clip-per-mesh", "torchtitan#766",
             "https://github.com/pytorch/torchtitan/issues/766",
             "grad norm differs across ranks under FSDP; under TP each tp rank also scales its "
             "copy of a replicated parameter by its own factor",
             clip=Clip.LOCAL),
    _mistake("weight-one-rank", Plan.SEQUENCE_PARALLEL, "sequence-parallel",
             "Megatron-DeepSpeed#271",
             "https://github.com/bigscience-workshop/Megatron-DeepSpeed/pull/271",
             "BLOOM's training found its tp-replicated layer norms diverged across TP ranks "
             "(#270 reproduces it) and re-synced them on every forward",
             fault=Fault.WEIGHT_ONE_RANK),
    _mistake("extra-microbatch-one-rank", Plan.SEQUENCE_PARALLEL, "sequence-parallel",
             "verl#6176",
             "https://github.com/verl-project/verl/issues/6176",
             "dynamic batching gives ranks different micro-batch counts under FSDP",
             fault=Fault.EXTRA_MICROBATCH),
    _mistake("clip-counts-replicated-tp-times", Plan.PLAIN, "clip-per-mesh",
             "ROCm/TransformerEngine#715",
             "https://github.com/ROCm/TransformerEngine/pull/715",
             "replicated weights counted tp_size times in the global gradient norm (1.52× at "
             "TP=8); also NeMo-RL#3788 (get_grad_norm sums replicated gradients over tp)",
             clip=Clip.WORLD_SUM),
    _mistake("norms-left-out-of-sp-3d", Plan.SP_WITHOUT_NORMS, "hsdp-tp-3d",
             "Megatron-LM#1446", "https://github.com/NVIDIA/Megatron-LM/issues/1446",
             "the first mistake on HSDP × TP: the norms' copies drift apart over tp while "
             "HSDP's replicas of each shard stay equal", mesh=MeshShape.THREE_D),
)
CASES: dict[str, Case] = {c.name: c for c in (*HEALTHY, *MISTAKES)}


def case(name: str) -> Case:
    if name not in CASES:
        raise BadInput(f"unknown TP corpus case {name!r}; choose one of {', '.join(CASES)}")
    return CASES[name]


def acts_on(c: Case, rank: int) -> bool:
    """Whether ``c``'s one-rank mistake acts on ``rank`` (every-rank mistakes need no test)."""
    return c.fault in (Fault.LR_ONE_RANK, Fault.WEIGHT_ONE_RANK, Fault.EXTRA_MICROBATCH) \
        and rank == FAULT_RANK
