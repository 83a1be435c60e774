"""The published FSDP2 mistakes the corpus reproduces, each with its public source, and the
corpus's other two axes (``Column``, ``Mesh``).

A pattern is what a user's script does wrong around ``fully_shard``; it acts either on every
rank alike (``Reach.EVERY_RANK``) or on one rank (``acting_rank``), from ``FAULT_STEP`` on or
from construction. Where no public report of the exact mistake was found, ``source`` says so and
``url`` is None; ``note`` names the closest public context, never a stand-in citation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from openclaw_ref.core.corpus_faults import Reach
from openclaw_ref.sync.errors import BadInput

FAULT_STEP = 2  # the first step a per-step pattern acts on
FAULT_RANK = 1  # the rank a one-rank pattern acts on (clamped to the world)
NOT_FOUND = "no public report found; the lead's issue names it"


class Column(enum.StrEnum):
    """Who runs the patterns: stock FSDP2, or FSDP2 under ``harden()`` (the script's ``wrap``)."""

    STOCK = "stock"
    HARDENED = "hardened"


class Mesh(enum.StrEnum):
    FSDP = "fsdp"  # 1-D: every rank shards
    HSDP = "hsdp"  # 2-D (world / 2, 2): replicate × shard


@dataclass(frozen=True)
class Pattern:
    """One mistake: its CLI/table name, public source (short name, URL or None), reach, whether
    it is in effect from construction, and a note on the source."""

    name: str
    source: str
    url: str | None
    reach: Reach
    at_construction: bool = False
    note: str = ""

    @property
    def first_step(self) -> int:
        return 0 if self.at_construction else FAULT_STEP


CORPUS: tuple[Pattern, ...] = (
    Pattern("optimizer-before-shard", "pytorch#149205",
            "https://github.com/pytorch/pytorch/issues/149205", Reach.EVERY_RANK, True,
            note="the optimizer holds parameters the training loop no longer updates; "
                 "accelerate#3394 re-points an optimizer built before fully_shard for this"),
    Pattern("extra-backward-one-rank", "verl#6176",
            "https://github.com/verl-project/verl/issues/6176", Reach.ONE_RANK,
            note="dynamic batching gives ranks different micro-batch counts under FSDP"),
    Pattern("no-sync-one-rank", NOT_FOUND, None, Reach.ONE_RANK,
            note="closest context: accelerate#3762 (FSDP2 accumulation via "
                 "set_requires_gradient_sync), no rank-divergent report"),
    Pattern("clip-local-norm", "torchtitan#766",
            "https://github.com/pytorch/torchtitan/issues/766", Reach.EVERY_RANK,
            note="grad norm differs across ranks under FSDP; also pytorch#170862"),
    Pattern("load-one-rank", "pytorch#105840",
            "https://github.com/pytorch/pytorch/issues/105840", Reach.ONE_RANK, True,
            note="FSDP1 report (weights on rank 0 only, training silently at chance); the "
                 "FSDP2 rank-0 load-and-broadcast flow is in pytorch#136336"),
    Pattern("mixed-precision-differs", NOT_FOUND, None, Reach.ONE_RANK, True),
    Pattern("unused-param-one-rank", "pytorch#158719",
            "https://github.com/pytorch/pytorch/issues/158719", Reach.ONE_RANK,
            note="also torchtitan#2747"),
    Pattern("lr-one-rank", "Lightning#4655",
            "https://github.com/Lightning-AI/pytorch-lightning/issues/4655", Reach.ONE_RANK,
            note="a DDP report (scheduler state differs on one rank); under FSDP2 the lr "
                 "acts on that rank's shards only"),
)
PATTERNS: dict[str, Pattern] = {p.name: p for p in CORPUS}
CLEAN = "none"  # the script without any mistake


def pattern(name: str) -> Pattern:
    if name not in PATTERNS:
        raise BadInput(f"unknown FSDP2 corpus pattern {name!r}; choose one of "
                       f"{', '.join((CLEAN, *PATTERNS))}")
    return PATTERNS[name]


def acting_rank(p: Pattern, world_size: int) -> int:
    """The rank a one-rank pattern acts on (``load-one-rank``: rank 0, the one that loads);
    an every-rank pattern: rank 0."""
    if p.reach is Reach.EVERY_RANK or p.name == "load-one-rank":
        return 0
    return min(FAULT_RANK, world_size - 1)


def acts_on(p: Pattern, rank: int, world_size: int) -> bool:
    return p.reach is Reach.EVERY_RANK or rank == acting_rank(p, world_size)
