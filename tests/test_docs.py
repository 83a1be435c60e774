"""What a reader is promised: the README answers its three questions early and keeps CI's two
commands verbatim; the docs' error table lists every error the hook library defines; every
link between the pages resolves; no user-facing text names an internal work item."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT, exception_classes_of

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "results" / "README.md"]
COMPARE = "python3 -m venv .venv && .venv/bin/pip install tox && .venv/bin/tox -e compare"
TESTS = "python3 -m venv .venv && .venv/bin/pip install tox && .venv/bin/tox -e tests"
WORK_ITEM = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def table_first_column(text: str) -> set[str]:
    """The backquoted names in the first column of a markdown table's rows."""
    return set(re.findall(r"^\| `([A-Za-z_]\w*)` \|", text, re.MULTILINE))


def test_the_errors_page_lists_every_exception_class_of_the_hook_library():
    defined = exception_classes_of(ROOT / "openclaw_ref" / "sync" / "errors.py")
    assert len(defined) >= 10
    assert table_first_column((DOCS / "errors.md").read_text()) == defined


def test_the_table_reader_sees_a_missing_row():
    text = "| error | when |\n|---|---|\n| `SyncTimeout` | late |\n| `BadInput` | bad |\n"
    assert table_first_column(text) == {"SyncTimeout", "BadInput"}
    assert table_first_column(text.replace("| `BadInput` | bad |\n", "")) == {"SyncTimeout"}


def test_the_readme_keeps_the_two_commands_ci_runs_verbatim():
    text = README.read_text()
    assert COMPARE in text and TESTS in text
    assert TESTS in (ROOT / ".ci" / "run").read_text()


def test_the_readme_says_how_to_guard_a_job_run_the_suite_and_reproduce_in_its_first_60_lines():
    head = "\n".join(README.read_text().splitlines()[:60])
    assert "state = harden(ddp)" in head
    assert "pytest -m conformance --pyargs openclaw_ref.conformance.suite" in head
    assert COMPARE in head


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _links(page: Path) -> list[tuple[str, str]]:
    """(target path, anchor) of every relative markdown link on ``page``."""
    found = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [tuple((link.split("#", 1) + [""])[:2]) for link in found
            if not re.match(r"[a-z]+://", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_on_a_page_resolves(page):
    for target, anchor in _links(page):
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {target}"
        if anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name}: {target}#{anchor}"


def test_no_user_facing_text_names_an_internal_work_item():
    files = [*PAGES, *(ROOT / "openclaw_ref").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *(ROOT / "results").rglob("*.md"), *(ROOT / "results").rglob("*.json"),
             ROOT / "tox.ini"]
    files = [f for f in files if ".asv" not in f.parts]  # asv's own copies of the checkout
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files
             for m in WORK_ITEM.finditer(f.read_text(encoding="utf-8"))]
    assert found == []
    assert WORK_ITEM.search("as issue 21 aims") and not WORK_ITEM.search("pytorch#104336")


def test_the_readmes_cost_line_is_the_published_records():
    """The README's cost line (harden() defaults ÷ the floor and ÷ stock DDP on the MLP, each
    with its interval, the hardware) is rendered from results/, never typed: it must equal what
    the renderer makes of the committed record, and name both references and their targets."""
    from openclaw_ref.reporting.blocks import block_of
    from openclaw_ref.reporting.record import load_record
    from openclaw_ref.reporting.speed import README_BLOCK, cost_line

    line = block_of(README.read_text(), README_BLOCK)
    assert line == cost_line(load_record(ROOT / "results" / "cpu2-gloo" / "raw.json"))
    assert "÷ the floor" in line and "target ≤ 1.02×" in line
    assert "≤ 1.05× stock DDP" in line and "not yet measured" in line


def _syncconfig_rows() -> list[tuple[str, str, str]]:
    """(field, default, read by) of every row of reference.md's SyncConfig table."""
    text = (DOCS / "reference.md").read_text()
    section = text.split("## `SyncConfig`", 1)[1].split("\n## ", 1)[0]
    return [(m.group(1), m.group(2), m.group(3).strip()) for m in re.finditer(
        r"^\| `(\w+)` \| `([^`]*)` \|.*\| ([^|]+) \|$", section, re.MULTILINE)]


def _doc_default(value: object) -> str:
    """A field's default as the table writes it: strings (and string enums) quoted."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def test_the_reference_lists_every_syncconfig_field_with_its_default_in_order():
    import dataclasses

    from openclaw_ref.sync.base import SyncConfig

    expected = [(f.name, _doc_default(f.default if f.default is not dataclasses.MISSING
                                      else f.default_factory()))
                for f in dataclasses.fields(SyncConfig)]
    assert [(name, default) for name, default, _ in _syncconfig_rows()] == expected


def test_every_field_the_reference_lists_is_one_harden_reads():
    """A user's config holds only ``harden()``'s knobs: the hook library's code reads
    ``cfg.<field>`` for every row (the benchmark's own knobs are ``arms.config.ArmConfig``'s)."""
    sync = ROOT / "openclaw_ref" / "sync"
    code = "\n".join(p.read_text() for p in sync.rglob("*.py"))
    rows = {name for name, _, _ in _syncconfig_rows()}
    assert {name for name in rows if re.search(rf"\bcfg\.{name}\b", code)} == rows
