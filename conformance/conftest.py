"""The conformance suite's own fixtures: the measured-figures report.

Every test that measures something (an outcome-matrix cell, an overflow rate, a consistency count)
adds it to the session's ``ConformanceReport``; at the end of the session the report is written
atomically as JSON to ``$OPENCLAW_CONFORMANCE_OUT`` or, by default, to
``conformance-report.json`` in pytest's base temporary directory (the path is printed in the
terminal summary). The results command renders it from there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openclaw_ref.conformance.report import ConformanceReport

ENV_OUT = "OPENCLAW_CONFORMANCE_OUT"


@pytest.fixture(scope="session")
def conformance_report(tmp_path_factory, request):
    report = ConformanceReport()
    yield report
    out = os.environ.get(ENV_OUT) or str(tmp_path_factory.getbasetemp() / "conformance-report.json")
    path = report.write(Path(out))
    request.config._openclaw_conformance_out = str(path)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = getattr(config, "_openclaw_conformance_out", None)
    if path:
        terminalreporter.write_line(f"conformance report: {path}")
