"""The ledger's vocabulary and bookkeeping: verdicts, findings, claims and how a rule registers.

A rule reads only the validated :class:`~openclaw_ref.reporting.record.RunRecord` and returns a
:class:`Finding`. Each family module binds ``claim = FAMILY.claim`` (a :class:`Family`), and
``@claim(id, text, source=..., outcomes=...)`` placed on a rule makes it a :class:`Claim` of that
family, in the order the rules are written. A rule that lacks its
evidence raises :class:`Missing`; :func:`assess` turns that into *not measurable here (evidence
missing)*, so no rule repeats that wording.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from openclaw_ref.reporting.record import RunRecord


class Verdict(str, Enum):
    """A claim's label; the value is the exact word the ledger prints (and JSON stores)."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    REFUTED = "refuted"
    INSIDE_NOISE = "inside the noise here"
    NOT_MEASURABLE = "not measurable here"
    SETTING = "setting"
    IMPLEMENTED = "implemented"
    NOT_IMPLEMENTED = "not implemented"
    OPEN_QUESTION = "open question"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# The outcome sets most rules declare: a judged figure, a judged timing, an interface.
JUDGED = (Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.NOT_MEASURABLE)
TIMED = (Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.INSIDE_NOISE, Verdict.NOT_MEASURABLE)
INTERFACE = (Verdict.IMPLEMENTED, Verdict.NOT_IMPLEMENTED, Verdict.NOT_MEASURABLE)


CMD_COMPARE = "openclaw-bench compare"

SOURCES: dict[str, str] = {
    "text 000": "「OpenCLAW 模型多GPU分布式训练中梯度同步不一致问题的系统性治理方案」: "
                "gradient-sync failures of the openclaw sparse model under DDP and the proposed "
                "fixes (§1 symptoms, §2 causes, §3 fix table, §4 implementation, §5 prevention "
                "and the 72-hour results, closing questions)",
    "text 004": "「OpenClaw 的 PyTorch Lightning 训练」: training openclaw with PyTorch Lightning "
                "(pain points, Lightning comparison, implementation, benchmark table, pitfalls, "
                "outcome)",
}


@dataclass(frozen=True)
class Finding:
    """What a rule found: its verdict label, what was run, what was measured, why, and the
    command that regenerates the evidence."""

    label: Verdict
    ran: str
    measured: str
    reason: str = ""
    command: str = CMD_COMPARE

    @property
    def verdict(self) -> str:
        return self.label + (f" ({self.reason})" if self.reason else "")


Rule = Callable[[RunRecord], Finding]


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    source: str  # source text and section, a key of SOURCES first
    rule: Rule
    outcomes: tuple[Verdict, ...]  # every label the rule can return, each one tested


class Missing(Exception):
    """The evidence a rule reads is absent from the record; the message names it."""


@dataclass
class Family:
    """The claims of one section of a source text, in the order their rules are written."""

    claims: list[Claim] = field(default_factory=list)

    def claim(self, id: str, text: str, *, source: str,
              outcomes: tuple[Verdict, ...]) -> Callable[[Rule], Rule]:
        """Register the decorated rule as claim ``id`` (returned unchanged)."""
        def register(rule: Rule) -> Rule:
            self.claims.append(Claim(id, text, source, rule, outcomes))
            return rule

        return register


def missing_field(what: str) -> str:
    return f"evidence missing: {what}"


def assess(claim: Claim, rec: RunRecord) -> Finding:
    """One claim's finding; absent evidence becomes 'not measurable here (evidence missing)'."""
    try:
        return claim.rule(rec)
    except Missing as exc:
        return Finding(Verdict.NOT_MEASURABLE, "—", missing_field(str(exc)), "evidence missing")
