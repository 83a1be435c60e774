"""``openclaw-bench`` / ``python -m openclaw_ref``: one entry point, one subcommand per job.

Exit codes (the whole project): 0 ok, 2 bad input, 3 a consistency check fired, 4 timeout or
hang, 1 anything else (a crashed rank, named). Bad input is rejected before any process starts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from openclaw_ref.errors import EXIT_BAD_INPUT, BadInput, OpenClawError, RankFailed, exit_code_for


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _ratio_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH in [0, 1); got {text!r}") from None
    return lo, hi


def _add_train(sub: argparse._SubParsersAction) -> None:
    from openclaw_ref.model import PRESETS
    from openclaw_ref.sync import STRATEGIES
    from openclaw_ref.sync.base import PLANNERS, WIRES

    p = sub.add_parser("train", help="train the openclaw model on N ranks and print a summary")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--sparsity", type=_ratio_range, default=None, metavar="LOW,HIGH",
                   help="range of the masked fraction per step (default: the seed's 0.12,0.68)")
    p.add_argument("--sync", default="ddp", choices=sorted(STRATEGIES))
    p.add_argument("--wire", default="fp32", choices=WIRES)
    p.add_argument("--scale", default="4096", help="FP16 pre-scale: a power of two, or auto")
    p.add_argument("--planner", default="static", choices=PLANNERS)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--replica-check-every", type=int, default=0, metavar="K")
    p.add_argument("--watchdog-s", type=float, default=60.0)
    p.add_argument("--inject", action="append", default=[], metavar="NAME[=VALUE][@RANK][:STEP]")
    p.add_argument("--imbalance", type=float, default=1.0,
                   help="most ÷ least frequent skill label (1 = balanced)")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default=None, help="write the run JSON here (rank 0)")
    p.set_defaults(func=_cmd_train)


def train_config_from_args(args: argparse.Namespace):
    """Build and validate a TrainConfig from parsed arguments (raises BadInput)."""
    from openclaw_ref.data import DataConfig
    from openclaw_ref.faults import parse_fault
    from openclaw_ref.sync.base import SyncConfig
    from openclaw_ref.train import TrainConfig

    try:
        data = DataConfig(imbalance=args.imbalance)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    cfg = TrainConfig(
        preset=args.preset, world_size=args.world_size, steps=args.steps,
        global_batch=args.global_batch, seed=args.seed, lr=args.lr, optimizer=args.optimizer,
        sparsity_range=args.sparsity, eval_every=args.eval_every,
        sync=SyncConfig(name=args.sync, wire=args.wire, scale=args.scale, planner=args.planner,
                        bucket_cap_mb=args.bucket_cap_mb,
                        replica_check_every=args.replica_check_every, watchdog_s=args.watchdog_s),
        data=data, faults=tuple(parse_fault(f) for f in args.inject), backend=args.backend,
        timeout_s=args.timeout_s, progress=not args.no_progress, out=args.out,
    )
    cfg.validate()
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from openclaw_ref.launch import LaunchConfig
    from openclaw_ref.report import train_summary_table
    from openclaw_ref.train import run_training

    cfg = train_config_from_args(args)
    LaunchConfig(cfg.world_size, backend=cfg.backend)  # backend and size checked before spawning
    record = run_training(cfg)
    if record is not None:
        print(train_summary_table(record))
        if args.out:
            print(f"run JSON: {args.out}")
        return 3 if record["events"] else 0
    return 0


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="openclaw-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BadInput as exc:
        sys.stderr.write(f"openclaw-bench: error: {exc}\n")
        return EXIT_BAD_INPUT
    except RankFailed as exc:
        sys.stderr.write(f"openclaw-bench: {exc}\n")
        if exc.traceback_text:
            sys.stderr.write(exc.traceback_text)
        return exc.exit_code
    except OpenClawError as exc:
        sys.stderr.write(f"openclaw-bench: {exc}\n")
        return exit_code_for(exc)


def console_main() -> None:
    raise SystemExit(main())
