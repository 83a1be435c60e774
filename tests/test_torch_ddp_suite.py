"""The logic of ``tox -e torch-ddp-suite`` without running PyTorch's tests: which of them are
DDP tests and which can run here, how a failed test's text becomes a table cell and a refusal,
how the record's counts and rows are rendered, and that docs/setups.md holds the table the
committed record renders (never typed)."""

from __future__ import annotations

import textwrap

from openclaw_ref.core.jsonio import read_json
from tests.helpers import ROOT
from torch_ddp_suite.render import BEGIN, END, counts, render, row, with_block
from torch_ddp_suite.run import Outcome, classify, exception_line
from torch_ddp_suite.selection import _methods, _names_ddp

SOURCE = textwrap.dedent('''
    class DistributedTest:
        class _DistTestBase:
            def _helper(self):
                return DistributedDataParallel(self.model)

            def test_through_a_helper(self):
                self._helper()

            def test_named_ddp_in_its_body(self):
                ddp = 1

            def test_all_reduce(self):
                dist.all_reduce(t)
''')


def _entry(stock: str, hardened: str | None, detail: str = "", ddps: int = 2) -> dict:
    arms = {"stock": {"outcome": stock, "seconds": 10.04, "detail": ""}}
    if hardened is not None:
        arms["hardened"] = {"outcome": hardened, "seconds": 12.0, "detail": detail,
                            "ddps_hardened": ddps}
    return {"status": "runnable", "why": "", "arms": arms}


RECORD = {
    "torch": "2.13.0+cpu", "backend": "gloo", "world_size": 2, "host": "x86_64, 2 cores",
    "started": "2026-12-07T15:00:00+00:00", "git": {"hardened": "0123456789abcdef"},
    "tests": {
        "test_a": _entry("passed", "passed"),
        "test_b": _entry("passed", "refused", "BadInput: refused | because"),
        "test_c": _entry("passed", "failed", "GradientsNotAveraged: at step 0"),
        "test_d": _entry("failed", "failed", "RuntimeError: stock fails too"),
        "test_no_ddp": _entry("passed", "passed", ddps=0),
        "test_gpu": {"status": "needs a GPU", "why": "skip_if_lt_x_gpu(2)", "arms": {}},
        "test_skip": {"status": "skipped by PyTorch", "why": "flaky", "arms": {}},
    },
}


def test_a_test_is_a_ddp_test_when_it_or_a_helper_it_calls_names_ddp():
    methods = _methods(SOURCE)
    assert _names_ddp("test_through_a_helper", methods, set())
    assert _names_ddp("test_named_ddp_in_its_body", methods, set())
    assert not _names_ddp("test_all_reduce", methods, set())


def test_a_failure_cell_is_a_ranks_badinput_line_else_the_last_exception_line():
    quoted = ("Process 1 exited with error code 10 and exception:\nTraceback (most recent call "
              "last):\n  File x\nopenclaw_ref.sync.errors.BadInput: this DDP model is hardened\n"
              "\nAssertionError: process 1 failed")
    assert exception_line(quoted) == "openclaw_ref.sync.errors.BadInput: this DDP model is hardened"
    assert exception_line("Traceback\n  File y\nRuntimeError: boom\n  more") == "RuntimeError: boom"


def test_a_failure_with_badinput_is_a_refusal_and_nothing_else_is():
    assert classify("failed", "x.BadInput: no") is Outcome.REFUSED
    assert classify("error", "RuntimeError: no") is Outcome.ERROR
    assert classify("passed", "") is Outcome.PASSED


def test_the_counts_judge_hardened_runs_of_the_tests_that_pass_stock_only():
    c = counts(RECORD)
    assert (c["ddp_tests"], c["run"], c["stock_passed"]) == (7, 5, 4)
    assert (c["both_passed"], c["refused"], c["hardened_not_passed"]) == (1, 1, 1)
    assert c["passed_none_hardened"] == 1  # a pass that hardened nothing is counted apart
    assert (c["needs_gpu"], c["skipped_by_pytorch"]) == (1, 1)


def test_a_row_shows_each_arm_and_what_a_hardened_run_that_did_not_pass_said():
    assert row("test_a", RECORD["tests"]["test_a"]) == [
        "`test_a`", "passed", "10.0", "passed", "12.0", "2", ""]
    assert row("test_b", RECORD["tests"]["test_b"])[-1] == "BadInput: refused \\| because"
    assert row("test_e", _entry("passed", None))[3:5] == ["not run", "—"]
    assert row("test_no_ddp", RECORD["tests"]["test_no_ddp"])[-1].startswith("no DDP reached")


def test_the_rendered_block_replaces_only_the_text_between_its_markers():
    page = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    out = with_block(page, render(RECORD))
    assert out.startswith("intro\n") and out.endswith(f"{END}\noutro\n")
    assert "old table" not in out and "1 refused by `harden()`" in out


def test_the_setups_page_holds_the_table_the_committed_record_renders():
    page = (ROOT / "docs" / "setups.md").read_text(encoding="utf-8")
    record = read_json(ROOT / "torch_ddp_suite" / "record.json")
    assert with_block(page, render(record)) == page
