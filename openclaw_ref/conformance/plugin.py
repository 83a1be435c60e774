"""The pytest plugin shipped in the wheel (entry point ``pytest11``): the conformance suite's
options, fixtures and report, in any environment where ``openclaw-sync`` is installed.

    pytest -m conformance --pyargs openclaw_ref.conformance.suite \
        [--openclaw-model MODULE:FACTORY] [--openclaw-hook MODULE:CALLABLE] \
        [--openclaw-world-size N] [--openclaw-wire native|fp32|fp16|bf16]

Without options the suite runs on the openclaw model. With ``--openclaw-model`` or
``--openclaw-hook``, the tests marked ``openclaw_model`` (they check the openclaw model and the
suite's own strategies) skip with that reason, and the model-agnostic checks
(``suite/test_target.py``) run on the user's model (default: the openclaw model) and hook.
Bad options are a usage error, in one line, before any rank starts (``target.validate_spec``).

Fixtures: ``target_spec`` (the options as a ``TargetSpec``), ``pools`` (one rank pool per world
size for the whole session), ``conformance_report`` (every measured figure, written at the end
as JSON to ``$OPENCLAW_CONFORMANCE_OUT`` or ``conformance-report.json`` in pytest's base temp
directory; the path is printed in the terminal summary).

Invariant: loading this plugin imports neither torch nor hypothesis — pytest loads it in every
session of an environment that has the package installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openclaw_ref.cli.choices import WIRES

ENV_OUT = "OPENCLAW_CONFORMANCE_OUT"
MARKERS = (
    "conformance: the conformance suite users run on their own cluster (pytest -m conformance)",
    "openclaw_model: needs the openclaw model; skipped under --openclaw-model",
    "slow: long cases (world size 8, nightly profile); run by `tox -e slow`, not in CI",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("openclaw", "openclaw-sync conformance suite")
    group.addoption("--openclaw-model", metavar="MODULE:FACTORY", default=None,
                    help="FACTORY() returns an openclaw_ref.conformance.target.Target "
                         "(default: the openclaw model)")
    group.addoption("--openclaw-hook", metavar="MODULE:CALLABLE", default=None,
                    help="CALLABLE(ddp_model, process_group) registers your comm hook "
                         "(default: stock DDP)")
    group.addoption("--openclaw-world-size", metavar="N", type=int, default=2,
                    help="ranks the model-agnostic checks spawn (default 2)")
    group.addoption("--openclaw-wire", choices=WIRES, default="fp32",
                    help="the dtype your hook sends; sets the equivalence tolerance")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    opt = config.option
    if opt.openclaw_model is None and opt.openclaw_hook is None:
        return
    from openclaw_ref.conformance.target import TargetSpec, validate_spec
    from openclaw_ref.sync.errors import BadInput

    spec = TargetSpec(opt.openclaw_model, opt.openclaw_hook, opt.openclaw_world_size,
                      opt.openclaw_wire)
    try:
        validate_spec(spec)
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None


def _spec(config: pytest.Config):
    from openclaw_ref.conformance.target import TargetSpec

    opt = config.option
    return TargetSpec(getattr(opt, "openclaw_model", None), getattr(opt, "openclaw_hook", None),
                      getattr(opt, "openclaw_world_size", 2), getattr(opt, "openclaw_wire", "fp32"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    given = [f"--openclaw-{name} {value}" for name, value in
             (("model", config.getoption("openclaw_model", None)),
              ("hook", config.getoption("openclaw_hook", None))) if value is not None]
    if not given:
        return
    skip = pytest.mark.skip(reason=f"checks the openclaw model and the suite's own strategies "
                                   f"(gating sparsity, parameter names); {', '.join(given)} "
                                   f"given")
    for item in items:
        if item.get_closest_marker("openclaw_model") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def target_spec(request):
    """What the model-agnostic checks train: the options as a ``TargetSpec``."""
    return _spec(request.config)


@pytest.fixture(scope="session")
def pools():
    """One live rank pool per world size (gloo) for the whole session."""
    from openclaw_ref.core.pools import PoolCache

    cache = PoolCache()
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def conformance_report(tmp_path_factory, request):
    from openclaw_ref.conformance.report import ConformanceReport

    report = ConformanceReport()
    yield report
    out = os.environ.get(ENV_OUT) or str(tmp_path_factory.getbasetemp() / "conformance-report.json")
    request.config.stash[_REPORT_PATH] = str(report.write(Path(out)))


_REPORT_PATH = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    path = config.stash.get(_REPORT_PATH, None)
    if path:
        terminalreporter.write_line(f"conformance report: {path}")
