"""docs/setups.md's table of PyTorch's own DDP tests, stock against hardened, rendered from the
record (never typed) into the block between ``BEGIN`` and ``END``.

One row per test that ran here: each arm's outcome and seconds, how many DDPs the hardened
run's ranks handed to ``harden()`` (both ranks together: the witness that the arm hardened what
the test built), and what a hardened run that did not pass said (a refusal: ``harden()``'s
``BadInput`` words, which name the fix). Above it, the counts; below it, the DDP tests not
run here, counted by reason (named in the record)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from openclaw_ref.reporting import blocks
from openclaw_ref.reporting.table import Table
from torch_ddp_suite.run import Arm, Outcome
from torch_ddp_suite.selection import Status

BLOCK = "torch-ddp-suite"
BEGIN = blocks.begin(BLOCK, "torch_ddp_suite/record.json")
END = blocks.end(BLOCK)
HEADERS = ["PyTorch's test", "stock", "s", "hardened", "s", "DDPs hardened",
           "what the hardened run said"]


def ran(record: dict) -> dict[str, dict]:
    return {n: e for n, e in record["tests"].items() if e["status"] == Status.RUNNABLE.value}


def outcome(entry: dict, arm: Arm) -> str | None:
    got = entry["arms"].get(arm.value)
    return None if got is None else got["outcome"]


def hardened_some(entry: dict) -> bool:
    """Did the hardened run's ranks hand a DDP to ``harden()`` (the witness count)?"""
    return bool((entry["arms"].get(Arm.HARDENED.value) or {}).get("ddps_hardened"))


def counts(record: dict) -> dict[str, int]:
    """The figures the caption states: tests run, passed stock; of those, passed hardened with
    a DDP hardened, passed hardened with none built to harden (the test builds no DDP, or
    expects DDP's constructor to raise), refused, and the rest; tests not run by reason."""
    tests = ran(record).values()
    stock_passed = [e for e in tests if outcome(e, Arm.STOCK) == Outcome.PASSED]
    passed = [e for e in stock_passed if outcome(e, Arm.HARDENED) == Outcome.PASSED]
    refused = [e for e in stock_passed if outcome(e, Arm.HARDENED) == Outcome.REFUSED]
    not_run = Counter(e["status"] for e in record["tests"].values()
                      if e["status"] != Status.RUNNABLE.value)
    return {"ddp_tests": len(record["tests"]), "run": len(tests),
            "stock_passed": len(stock_passed),
            "both_passed": sum(hardened_some(e) for e in passed),
            "passed_none_hardened": sum(not hardened_some(e) for e in passed),
            "refused": len(refused),
            "hardened_not_passed": len(stock_passed) - len(passed) - len(refused),
            "needs_gpu": not_run[Status.NEEDS_GPU.value],
            "skipped_by_pytorch": not_run[Status.SKIPPED_BY_PYTORCH.value]}


def _cells(entry: dict, arm: Arm) -> list[str]:
    got = entry["arms"].get(arm.value)
    if got is None:
        return ["not run", "—"]
    return [got["outcome"], f"{got['seconds']:.1f}"]


def row(name: str, entry: dict) -> list[str]:
    hardened = entry["arms"].get(Arm.HARDENED.value) or {}
    said = hardened.get("detail", "") if hardened.get("outcome") != Outcome.PASSED else ""
    if hardened and not said and not hardened_some(entry):
        said = "no DDP reached harden(): the test builds none whose constructor returns"
    return [f"`{name}`", *_cells(entry, Arm.STOCK), *_cells(entry, Arm.HARDENED),
            str(hardened.get("ddps_hardened", "—")), said.replace("|", "\\|")]


def table(record: dict) -> Table:
    c = counts(record)
    caption = (f"PyTorch {record['torch']}'s own DDP tests, stock and with every DDP passed to "
               f"`harden()` (`tox -e torch-ddp-suite`, {record['backend']}, "
               f"{record['world_size']} ranks, {record['host']}, {record['started'][:10]}, "
               f"git {record['git'].get(Arm.HARDENED.value, '?')[:10]}): {c['run']} of its "
               f"{c['ddp_tests']} DDP tests run without a GPU; {c['stock_passed']} pass stock, "
               f"{c['both_passed']} of them hardened too with their DDPs hardened, "
               f"{c['passed_none_hardened']} hardened too with no DDP to harden, "
               f"{c['refused']} refused by `harden()`, {c['hardened_not_passed']} failing "
               f"hardened")
    rows = [row(n, e) for n, e in sorted(ran(record).items())]  # as the record stores them
    return Table(caption, HEADERS, rows)


def render(record: dict) -> str:
    c = counts(record)
    return (f"{table(record).markdown()}\n\nNot run here: {c['needs_gpu']} DDP tests gated on "
            f"GPUs, {c['skipped_by_pytorch']} that PyTorch skips itself on this set-up "
            f"(each named with its reason in `torch_ddp_suite/record.json`). *DDPs hardened*: "
            f"the DDPs the hardened run's ranks handed to `harden()`, both ranks together, "
            f"counted as they were hardened (a pass with none is counted apart, never as "
            f"hardened). Seconds are wall "
            f"time of one subprocess (spawn, 2 ranks, the test) on a shared host.\n")


def with_block(page: str, body: str) -> str:
    """``page`` with the text between ``BEGIN`` and ``END`` replaced by ``body``."""
    return blocks.with_block(page, BLOCK, body)


def publish(record: dict, page: Path) -> None:
    blocks.rewrite(page, BLOCK, render(record))
