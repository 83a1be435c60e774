"""The pytest plugin shipped in the wheel (entry point ``pytest11``): the conformance suite's
options, fixtures and report, in any environment where ``openclaw-sync`` is installed.

    pytest -m conformance --pyargs openclaw_ref.conformance.suite \
        [--openclaw-model MODULE:FACTORY] [--openclaw-hook MODULE:CALLABLE] \
        [--openclaw-world-size N] [--openclaw-wire native|fp32|fp16|bf16] \
        [--openclaw-wrapper ddp|fsdp2|hsdp|fsdp2-tp]

Without options the suite runs on the openclaw model, and proves itself on its zoo of models
and hooks (``zoo``). With ``--openclaw-model`` or ``--openclaw-hook``, the tests marked
``openclaw_model`` (they check the openclaw model and the suite's own strategies) or ``zoo``
skip with that reason, and the model-agnostic checks (``suite/test_target.py``) run on the
user's model (default: the openclaw model) and hook, judged against stock DDP on the same
shards. With ``--openclaw-wrapper fsdp2``/``hsdp`` the tests marked ``ddp_hook`` (a DDP comm
hook's checks) skip too, and those marked ``fsdp_wrapper`` (``suite/test_fsdp_target.py``:
``harden()`` of ``fully_shard``, or the ``--openclaw-hook`` subject, against stock
``fully_shard``) run; without it, those skip. With ``--openclaw-wrapper fsdp2-tp`` (FSDP2 ×
tensor parallel on a (W/2, 2) (dp, tp) mesh, 4 ranks by default) only the tests marked
``tp_wrapper`` (``suite/test_tp_target.py``) run of those three kinds. Bad options are a usage
error, in one line, before any rank starts (``target.validate_spec``; a bad wrapper name:
pytest's own choice check).

A test marked both ``conformance`` and ``slow`` runs only when the ``-m`` expression names
``slow`` (``-m "conformance or slow"``, ``tox -e slow``): ``pytest -m conformance`` is the
quick pass a user runs, and the slow cases are deselected from it.

Fixtures: ``target_spec`` (the options as a ``TargetSpec``), ``pools`` (one rank pool per world
size for the whole session), ``target_runs`` (``oracle.TargetRuns``: each run of stock DDP and
of a hook made once per session, on ``pools``), ``conformance_report`` (every measured figure,
written at the end as JSON to ``$OPENCLAW_CONFORMANCE_OUT`` or ``conformance-report.json`` in
pytest's base temp directory; the path, and the model's properties, are printed in the
terminal summary).

Invariant: loading this plugin imports neither torch nor hypothesis — pytest loads it in every
session of an environment that has the package installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openclaw_ref.cli.choices import WIRES, WRAPPERS

ENV_OUT = "OPENCLAW_CONFORMANCE_OUT"
MARKERS = (
    "conformance: the conformance suite users run on their own cluster (pytest -m conformance)",
    "openclaw_model: needs the openclaw model; skipped under --openclaw-model",
    "zoo: the suite's proof on its own models and hooks; skipped under --openclaw-model/-hook",
    "ddp_hook: checks of a DDP comm hook; skipped under --openclaw-wrapper fsdp2/hsdp/fsdp2-tp",
    "fsdp_wrapper: checks of --openclaw-wrapper fsdp2/hsdp; skipped under any other wrapper",
    "tp_wrapper: checks of --openclaw-wrapper fsdp2-tp; skipped under any other wrapper",
    "slow: long cases (world size 8, nightly profile); run by `tox -e slow`, not in CI",
)
SUITE_OWN = ("openclaw_model", "zoo")
# the wrappers each wrapper-specific marker's tests apply to (the others skip them)
WRAPPER_MARKERS = {"ddp_hook": ("ddp",), "fsdp_wrapper": ("fsdp2", "hsdp"),
                   "tp_wrapper": ("fsdp2-tp",)}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("openclaw", "openclaw-sync conformance suite")
    group.addoption("--openclaw-model", metavar="MODULE:FACTORY", default=None,
                    help="FACTORY() returns an openclaw_ref.conformance.target.Target "
                         "(default: the openclaw model)")
    group.addoption("--openclaw-hook", metavar="MODULE:CALLABLE", default=None,
                    help="CALLABLE(ddp_model, process_group) registers your comm hook "
                         "(default: stock DDP)")
    group.addoption("--openclaw-world-size", metavar="N", type=int, default=None,
                    help="ranks the model-agnostic checks spawn (default 2; fsdp2-tp: 4)")
    group.addoption("--openclaw-wire", choices=WIRES, default="fp32",
                    help="the dtype your hook sends; sets the equivalence tolerance")
    group.addoption("--openclaw-wrapper", choices=WRAPPERS, default="ddp",
                    help="ddp: your comm hook against stock DDP (default); fsdp2 / hsdp / "
                         "fsdp2-tp: harden() (or --openclaw-hook CALLABLE(fsdp_model, mesh)) of "
                         "fully_shard on a 1-D / (W/2, 2) mesh / your Target's tp_plan on a "
                         "(W/2, 2) (dp, tp) mesh, against the same stock job")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    opt = config.option
    if opt.openclaw_model is None and opt.openclaw_hook is None \
            and getattr(opt, "openclaw_wrapper", "ddp") == "ddp":
        return
    from openclaw_ref.conformance.target import validate_spec
    from openclaw_ref.sync.errors import BadInput

    try:
        validate_spec(_spec(config))
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None


def _spec(config: pytest.Config):
    from openclaw_ref.conformance.target import (
        TargetSpec,
        default_world_size,
        with_default_subject,
    )

    opt = config.option
    wrapper = getattr(opt, "openclaw_wrapper", "ddp")
    world_size = getattr(opt, "openclaw_world_size", None)
    world_size = default_world_size(wrapper) if world_size is None else world_size
    return with_default_subject(TargetSpec(
        getattr(opt, "openclaw_model", None), getattr(opt, "openclaw_hook", None),
        world_size, getattr(opt, "openclaw_wire", "fp32"), wrapper))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _deselect_slow_conformance(config, items)
    wrapper = config.getoption("openclaw_wrapper", "ddp") or "ddp"
    _skip_marked(items, [m for m, wrappers in WRAPPER_MARKERS.items() if wrapper not in wrappers],
                 f"checks of another wrapper than --openclaw-wrapper {wrapper}")
    given = [f"--openclaw-{name} {value}" for name, value in
             (("model", config.getoption("openclaw_model", None)),
              ("hook", config.getoption("openclaw_hook", None)),
              ("wrapper", None if wrapper == "ddp" else wrapper)) if value is not None]
    if given:
        _skip_marked(items, SUITE_OWN, f"checks the openclaw model, the suite's own strategies "
                                        f"or its zoo (gating sparsity, parameter names, its own "
                                        f"models); {', '.join(given)} given")


def _skip_marked(items: list[pytest.Item], markers, reason: str) -> None:
    markers = (markers,) if isinstance(markers, str) else markers
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if any(item.get_closest_marker(m) is not None for m in markers):
            item.add_marker(skip)


def _deselect_slow_conformance(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the tests marked both ``conformance`` and ``slow`` unless ``-m`` names ``slow``."""
    markexpr = config.getoption("markexpr", "") or ""
    if "slow" in markexpr:
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None
            and i.get_closest_marker("conformance") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        dropped = set(slow)
        items[:] = [i for i in items if i not in dropped]


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
def target_runs(pools):
    """Stock DDP and each hook's run, each made once per session (``oracle.TargetRuns``)."""
    from openclaw_ref.conformance.oracle import TargetRuns

    return TargetRuns(pools.get)


@pytest.fixture(scope="session")
def conformance_report(tmp_path_factory, request):
    from openclaw_ref.conformance.report import ConformanceReport

    report = ConformanceReport()
    yield report
    out = os.environ.get(ENV_OUT) or str(tmp_path_factory.getbasetemp() / "conformance-report.json")
    request.config.stash[_REPORT_PATH] = str(report.write(Path(out)))
    request.config.stash[_PROPERTIES] = [f"{c.figures.get('model', '?')}: {c.detail}"
                                         for c in report.checks if c.role == "property"]


_REPORT_PATH = pytest.StashKey[str]()
_PROPERTIES = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    for line in config.stash.get(_PROPERTIES, []):
        terminalreporter.write_line(f"model property of {line}")
    path = config.stash.get(_REPORT_PATH, None)
    if path:
        terminalreporter.write_line(f"conformance report: {path}")
