"""``openclaw-bench compare`` (run the comparison, write results/<machine>/) and
``openclaw-bench report`` (re-render every table, plot and ledger from raw.json)."""

from __future__ import annotations

import argparse
import sys

from openclaw_ref.cli.choices import BACKENDS, PRESETS, SECTIONS
from openclaw_ref.sync.errors import BadInput


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run the main comparison and write results/<machine>/ "
                                       "(the full run: ~25 min on 2 CPU cores)")
    p.add_argument("--world-sizes", default=None,
                   help="comma-separated (None: 1,2,4 on CPU; powers of two up to the GPUs)")
    p.add_argument("--preset", default="tiny", choices=PRESETS, help="model size")
    p.add_argument("--steps", type=int, default=40, help="training steps per strategy run")
    p.add_argument("--repeats", type=int, default=5,
                   help="interleaved repeats of every strategy run (timing verdicts need 5)")
    p.add_argument("--p2-repeats", type=int, default=15,
                   help="off/on pairs of the P2 skew barrier (ablations), a new jitter draw each")
    p.add_argument("--curve-steps", type=int, default=300, help="steps of the long loss curves")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: nccl with one GPU per rank, else gloo")
    p.add_argument("--out-root", default="results", help="results are written under this")
    p.add_argument("--tag", default=None,
                   help="results sub-directory (None: the machine class, e.g. cpu2-gloo)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the sections an interrupted run of the same options finished "
                        "(kept in <results dir>/.partial/) and run only the rest")
    p.set_defaults(func=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> int:
    from openclaw_ref.experiments.compare import (
        CompareConfig,
        CompareInterrupted,
        run_compare,
        write_results,
    )

    kw: dict = {}
    if args.world_sizes:
        try:
            kw["world_sizes"] = tuple(int(x) for x in args.world_sizes.split(","))
        except ValueError:
            raise BadInput(f"--world-sizes must be integers; got {args.world_sizes!r}") from None
    cfg = CompareConfig(preset=args.preset, steps=args.steps, repeats=args.repeats,
                        p2_repeats=args.p2_repeats,
                        curve_steps=args.curve_steps, backend=args.backend,
                        sections=tuple(x for x in args.sections.split(",") if x),
                        out_root=args.out_root, tag=args.tag, **kw)
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

