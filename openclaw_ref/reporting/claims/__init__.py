"""The claims ledger: every claim of the source texts, its source, and a verdict computed from
the run record.

Each claim's rule (its docstring states the rule) reads only the validated
:class:`~openclaw_ref.reporting.record.RunRecord` and declares, where it registers with
``@claim(id, ...)``, the outcomes it can return; the unit tests drive every rule to every
declared outcome with synthetic records (a rule that cannot flip is a defect). Vocabulary
(:class:`Verdict`):

- *reproduced* / *not reproduced*: the measured effect is at least / below the rule's threshold
  (for a claimed effect size, half of it: ``1 + (seed_ratio - 1) / 2``);
- *refuted*: the measurement contradicts the mechanism as described;
- *inside the noise here*: a timing claim whose bootstrap interval contains the threshold;
- *not measurable here*: the recorded environment lacks the hardware (named, with the command
  that measures it there), the repeats are too few, or the evidence was not recorded (said so);
- *setting*, *implemented* / *not implemented*, *open question*: descriptions of the source
  texts' setting, interfaces this suite provides, and questions they ask; never *reproduced*.

Where things live: ``registry`` (verdicts, findings, claims, registration), ``evidence``
(readers of the record), ``judging`` (thresholds, repeats, fair world sizes, commands), one
module per claim family (``setting``, ``symptoms``, ``mechanisms``, ``fixes``, ``prevention``,
``results``, ``questions``, ``lightning``), and ``ledger`` (their order and :func:`assess_all`).
"""

from openclaw_ref.reporting.claims.judging import MIN_REPEATS
from openclaw_ref.reporting.claims.ledger import CLAIMS, assess_all
from openclaw_ref.reporting.claims.registry import SOURCES, Claim, Finding, Verdict, assess

__all__ = ["CLAIMS", "MIN_REPEATS", "SOURCES", "Claim", "Finding", "Verdict", "assess",
           "assess_all"]
