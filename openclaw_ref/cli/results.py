"""``openclaw-bench compare`` (run the comparison, write results/<machine>/) and
``openclaw-bench report`` (re-render every table, plot and ledger from raw.json)."""

from __future__ import annotations

import argparse
import sys

from openclaw_ref.cli.choices import BACKENDS, PRESETS, SECTIONS
from openclaw_ref.sync.errors import BadInput

# Options whose default --quick changes: (dest, type, help, full default, --quick's). The help
# shows both; an option given on the command line overrides either (tests/test_cli.py checks
# the two defaults against CompareConfig and QUICK_SETTINGS).
SIZING = (
    ("steps", int, "training steps per strategy run", "40", "8"),
    ("repeats", int, "interleaved repeats of every strategy run (timing verdicts need 5)", "5",
     "2"),
    ("p2_repeats", int, "off/on pairs of the P2 skew barrier (ablations), a new jitter draw each",
     "15", "2"),
    ("curve_steps", int, "steps of the long loss curves", "300", "20"),
)


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run the main comparison and write results/<machine>/ "
                                       "(the full run: ~45 min on 2 CPU cores; --quick: a "
                                       "few minutes, into a scratch directory)")
    p.add_argument("--quick", action="store_true",
                   help="a representative subset of every section at small settings, written "
                        "to a scratch directory (never under results/) and labelled a quick "
                        "run in every file: to see what the full comparison produces")
    p.add_argument("--world-sizes", default=None,
                   help="comma-separated (None: 1,2,4 on CPU; powers of two up to the GPUs; "
                        "--quick: 1,2)")
    p.add_argument("--preset", default="tiny", choices=PRESETS, help="model size")
    for dest, kind, text, full, quick in SIZING:
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, type=kind,
                       default=argparse.SUPPRESS,
                       help=f"{text} (default: {full}; with --quick: {quick})")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of: {', '.join(SECTIONS)} (a subset "
                        "replaces only those sections of the record already in the results "
                        "directory, which must have the same settings)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: nccl with one GPU per rank, else gloo")
    p.add_argument("--out-root", default=argparse.SUPPRESS,
                   help="results are written under this (default: results; with --quick: a "
                        "new temporary directory)")
    p.add_argument("--tag", default=None,
                   help="results sub-directory (None: the machine class, e.g. cpu2-gloo)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the sections an interrupted run of the same options finished "
                        "(kept in <results dir>/.partial/) and run only the rest")
    p.set_defaults(func=_cmd_compare)


def _compare_config(args: argparse.Namespace):
    """The run's ``CompareConfig``: the full or the quick settings, with every option given."""
    import tempfile

    from openclaw_ref.experiments.settings import CompareConfig, quick_config

    kw: dict = {dest: getattr(args, dest) for dest, *_ in SIZING if hasattr(args, dest)}
    if args.world_sizes:
        try:
            kw["world_sizes"] = tuple(int(x) for x in args.world_sizes.split(","))
        except ValueError:
            raise BadInput(f"--world-sizes must be integers; got {args.world_sizes!r}") from None
    if hasattr(args, "out_root"):
        kw["out_root"] = args.out_root
    kw.update(preset=args.preset, backend=args.backend, tag=args.tag,
              sections=tuple(x for x in args.sections.split(",") if x))
    if not args.quick:
        return CompareConfig(**kw)
    if args.resume and "out_root" not in kw:
        raise BadInput("--quick --resume needs the --out-root of the run to resume")
    if "out_root" in kw:
        return quick_config(**kw)
    quick_config(**kw, out_root=tempfile.gettempdir()).validate()  # before a directory is made
    return quick_config(**kw, out_root=tempfile.mkdtemp(prefix="openclaw-quick-"))


def _cmd_compare(args: argparse.Namespace) -> int:
    from openclaw_ref.experiments.compare import (
        CompareInterrupted,
        run_compare,
        write_results,
    )

    cfg = _compare_config(args)
    cfg.validate()
    out_dir = cfg.out_dir()
    try:
        raw = run_compare(cfg, resume=args.resume)
    except CompareInterrupted as exc:
        sys.stderr.write(f"openclaw-bench compare: {exc}. The previous results in {out_dir} are "
                         f"unchanged; the finished sections are kept in {out_dir}/.partial: "
                         f"run the same command with --resume to run only the rest.\n")
        return 1
    for path in write_results(raw, out_dir):
        print(f"wrote {path}")
    if cfg.quick:
        print(f"quick run: a representative subset of every section at small settings, in "
              f"{out_dir} — not results, do not publish them; the full comparison is "
              "`tox -e compare` (results/<machine>/)")
    return 0


def add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render tables, plots and the claims ledger from raw.json")
    p.add_argument("dirs", nargs="*",
                   help="results/<machine> directories (none given: every one under --out-root)")
    p.add_argument("--out-root", default="results",
                   help="where to look for */raw.json when no directory is given")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from openclaw_ref.core.jsonio import check_output_dir
    from openclaw_ref.reporting.render import render_all

    dirs = [Path(d) for d in args.dirs] or sorted(
        p.parent for p in Path(args.out_root).glob("*/raw.json"))
    if not dirs:
        raise BadInput(f"no results found under {args.out_root}/*/raw.json; run compare first")
    for d in dirs:
        if not (d / "raw.json").is_file():
            raise BadInput(f"{d} has no raw.json")
        check_output_dir(d, "report")
    for d in dirs:
        for path in render_all(d):
            print(f"wrote {path}")
    return 0

