"""``openclaw-bench`` / ``python -m openclaw_ref``: one entry point, one subcommand per job.

Exit codes (the whole project): 0 ok, 2 bad input, 3 a consistency check fired, 4 timeout or
hang, 5 an environment error (``doctor``), 1 anything else (a crashed rank, named). Bad input
is rejected before any process starts.

Each subcommand lives beside its siblings by what it does: ``train`` (``cli/train.py``),
``compare``/``report`` (``cli/results.py``), ``doctor``/``conform`` (``cli/checks.py``) and the
stand-alone experiments ``hook-cost``/``verify-scale``/``p2`` (``cli/experiments.py``). A
subcommand imports torch only when it runs (its choice lists are ``cli/choices.py``'s plain
constants), so ``--help`` and ``--version`` stay fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from openclaw_ref.cli.failure import report_failure
from openclaw_ref.sync.errors import EXIT_BAD_INPUT, OpenClawError

DESCRIPTION = ("openclaw-sync: benchmark and conformance suite for gradient synchronization of "
               "a dynamically sparse model under data-parallel training. Exit codes: 0 ok, "
               "2 bad input (rejected before any process starts), 3 a consistency check fired, "
               "4 timeout or hang, 5 an environment error (doctor), 1 anything else.")


def package_version() -> str:
    """The installed distribution's version; from a source tree that is not installed, says so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openclaw-sync")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad input in one line with exit code 2, and shows every option's
    default in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from openclaw_ref.cli.checks import add_conform, add_doctor
    from openclaw_ref.cli.experiments import (
        add_hook_cost,
        add_p2,
        add_startup_scale,
        add_verify_scale,
    )
    from openclaw_ref.cli.results import add_compare, add_report
    from openclaw_ref.cli.train import add_train

    return [add_train, add_compare, add_report, add_doctor, add_conform, add_hook_cost,
            add_verify_scale, add_startup_scale, add_p2]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="openclaw-bench", description=DESCRIPTION)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for add in _commands():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a failure is worded by ``cli/failure.py`` (one first line; details
    only with ``--verbose`` where the subcommand has it, always where it has not)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OpenClawError as exc:
        return report_failure(exc, verbose=getattr(args, "verbose", True))


def console_main(entry: Callable[[], int] = main) -> None:
    """Run ``entry`` and end the process with its code (torch is imported after parsing)."""
    code = entry()
    from openclaw_ref.core.launch import exit_process

    exit_process(code)

