"""``ConformanceReport``: what a conformance run measured, as the JSON the results command
renders (written by the pytest suite's fixture and by the cluster mode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openclaw_ref.conformance.fault_matrix import CaseOutcome
from openclaw_ref.conformance.settings import CheckResult

REPORT_SCHEMA = "openclaw-conformance/1"


@dataclass
class ConformanceReport:
    """What a conformance run measured: the outcome matrix, check results (overflow rates,
    consistency counts …), with the environment. Rendered by the results command.

    JSON: ``{"schema", "environment", "matrix": [CaseOutcome…], "checks": [CheckResult…],
    "matrix_settings": {...}}`` — written atomically."""

    matrix: list[CaseOutcome] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    matrix_settings: dict = field(default_factory=dict)

    def add_check(self, result: CheckResult) -> CheckResult:
        self.checks.append(result)
        return result

    def to_json(self) -> dict:
        from openclaw_ref.core.environment import environment

        return {"schema": REPORT_SCHEMA, "environment": environment(),
                "matrix_settings": self.matrix_settings,
                "matrix": [o.to_json() for o in self.matrix],
                "checks": [c.to_json() for c in self.checks]}

    def write(self, path) -> Any:
        from openclaw_ref.core.jsonio import write_json_atomic

        return write_json_atomic(path, self.to_json())
