"""Text 000's closing questions: listed in the ledger, never judged.

Both questions share one rule, registered once per question.
"""

from __future__ import annotations

from openclaw_ref.reporting.claims.judging import NOTHING
from openclaw_ref.reporting.claims.registry import Family, Finding, Verdict
from openclaw_ref.reporting.record import RunRecord

FAMILY = Family()
claim = FAMILY.claim
QUESTIONS = "text 000, closing questions"


def open_question(rec: RunRecord) -> Finding:
    """A question text 000 asks, not a claim: listed, never judged."""
    return Finding(Verdict.OPEN_QUESTION, "—", "a question, not a claim", command=NOTHING)


claim("Q1", "Open: with channel-wise sparsity, should L2-norm bucketing become "
      "KL-divergence-driven alignment?", source=QUESTIONS,
      outcomes=(Verdict.OPEN_QUESTION,))(open_question)
claim("Q2", "Open: adapting NCCL parameters across GPU generations in mixed A100+H100 "
      "clusters", source=QUESTIONS, outcomes=(Verdict.OPEN_QUESTION,))(open_question)
