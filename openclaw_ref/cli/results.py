"""``openclaw-bench compare`` (run the comparison, write results/<machine>/) and
``openclaw-bench report`` (re-render every table, plot and ledger from raw.json)."""

from __future__ import annotations

import argparse
import sys

from openclaw_ref.sync.errors import BadInput


def add_compare(sub: argparse._SubParsersAction) -> None:
    from openclaw_ref.experiments.registry import SECTIONS

    p = sub.add_parser("compare", help="run the main comparison and write results/<machine>/")
    p.add_argument("--world-sizes", default=None,
                   help="comma-separated (default: 1,2,4 on CPU; powers of two up to the GPUs)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--curve-steps", type=int, default=300)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--out-root", default="results")
    p.add_argument("--tag", default=None, help="results sub-directory (default: machine class)")
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
                        curve_steps=args.curve_steps, backend=args.backend,
                        sections=tuple(x for x in args.sections.split(",") if x),
                        out_root=args.out_root, tag=args.tag, **kw)
    cfg.validate()
    out_dir = cfg.out_dir()
    try:
        raw = run_compare(cfg)
    except CompareInterrupted as exc:
        sys.stderr.write(f"openclaw-bench compare: {exc}. Nothing was written; the previous "
                         f"results in {out_dir} are unchanged.\n")
        return 1
    for path in write_results(raw, out_dir):
        print(f"wrote {path}")
    return 0


def add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render tables, plots and the claims ledger from raw.json")
    p.add_argument("dirs", nargs="*", help="results/<machine> directories (default: all)")
    p.add_argument("--out-root", default="results")
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

