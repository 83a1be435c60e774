"""``openclaw-bench`` / ``python -m openclaw_ref``: one entry point, one subcommand per job.

Exit codes (the whole project): 0 ok, 2 bad input, 3 a consistency check fired, 4 timeout or
hang, 1 anything else (a crashed rank, named). Bad input is rejected before any process starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

from openclaw_ref.core.errors import RankFailed, exit_code_for
from openclaw_ref.sync.errors import EXIT_BAD_INPUT, BadInput, OpenClawError


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
    from openclaw_ref.core.model import PRESETS
    from openclaw_ref.sync import STRATEGIES
    from openclaw_ref.sync.base import NonFinitePolicy, Planner, Wire

    p = sub.add_parser("train", help="train the openclaw model on N ranks and print a summary")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks to spawn (default 2; under torchrun: its WORLD_SIZE)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--sparsity", type=_ratio_range, default=None, metavar="LOW,HIGH",
                   help="range of the masked fraction per step (default: the seed's 0.12,0.68)")
    p.add_argument("--sync", default="ddp", choices=sorted(STRATEGIES))
    p.add_argument("--wire", default="native", choices=[w.value for w in Wire])
    p.add_argument("--scale", default="4096", help="FP16 pre-scale: a power of two, or auto")
    p.add_argument("--nonfinite", default="skip", choices=[n.value for n in NonFinitePolicy],
                   help="a rank's NaN/inf gradient: skip the step on every rank, or raise")
    p.add_argument("--planner", default="static", choices=[k.value for k in Planner])
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
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT+rank (0: a free port per "
                        "rank, logged); needs the metrics extra")
    p.add_argument("--skew-barrier-ms", type=float, default=None, metavar="MS",
                   help="seed P2: barrier before the next backward when the across-rank std of "
                        "the sync time exceeds MS (the seed used 1.5); off by default")
    p.set_defaults(func=_cmd_train)


def train_config_from_args(args: argparse.Namespace):
    """Build and validate a TrainConfig from parsed arguments (raises BadInput)."""
    from openclaw_ref.core.data import DataConfig
    from openclaw_ref.core.faults import parse_fault
    from openclaw_ref.core.launch import under_torchrun
    from openclaw_ref.core.train import TrainConfig
    from openclaw_ref.ops.prometheus import MetricsConfig
    from openclaw_ref.sync.base import SyncConfig

    world_size = args.world_size if args.world_size is not None else 2
    if under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        if args.world_size not in (None, world_size):
            raise BadInput(f"--world-size {args.world_size} disagrees with torchrun's "
                           f"WORLD_SIZE {world_size}")
    try:
        data = DataConfig(imbalance=args.imbalance)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    cfg = TrainConfig(
        preset=args.preset, world_size=world_size, steps=args.steps,
        global_batch=args.global_batch, seed=args.seed, lr=args.lr, optimizer=args.optimizer,
        sparsity_range=args.sparsity, eval_every=args.eval_every,
        sync=SyncConfig(name=args.sync, wire=args.wire, scale=args.scale, planner=args.planner,
                        nonfinite=args.nonfinite,
                        bucket_cap_mb=args.bucket_cap_mb,
                        replica_check_every=args.replica_check_every, watchdog_s=args.watchdog_s),
        data=data, faults=tuple(parse_fault(f) for f in args.inject), backend=args.backend,
        metrics=MetricsConfig(port=args.metrics_port, skew_barrier_ms=args.skew_barrier_ms),
        timeout_s=args.timeout_s, progress=not args.no_progress, out=args.out,
    )
    cfg.validate()
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from openclaw_ref.core.launch import LaunchConfig
    from openclaw_ref.core.train import run_training
    from openclaw_ref.reporting.render import train_summary_table

    cfg = train_config_from_args(args)
    LaunchConfig(cfg.world_size, backend=cfg.backend)  # backend and size checked before spawning
    record = run_training(cfg)
    if record is not None:
        print(train_summary_table(record))
        if args.out:
            print(f"run JSON: {args.out}")
        return 3 if record["events"] else 0
    return 0


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="print torch/CUDA/NCCL/gloo facts and lint NCCL variables "
                                      "(exit 2 on an error, or on a warning with --strict)")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                   help="the backend you intend to run (nccl is refused below NCCL 2.13.4)")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 2)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from openclaw_ref.ops.doctor import run_doctor

    text, code = run_doctor(backend=args.backend, strict=args.strict, as_json=args.json)
    print(text)
    return code


def _add_compare(sub: argparse._SubParsersAction) -> None:
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


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render tables, plots and the claims ledger from raw.json")
    p.add_argument("dirs", nargs="*", help="results/<machine> directories (default: all)")
    p.add_argument("--out-root", default="results")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from openclaw_ref.reporting.render import render_all

    dirs = [Path(d) for d in args.dirs] or sorted(
        p.parent for p in Path(args.out_root).glob("*/raw.json"))
    if not dirs:
        raise BadInput(f"no results found under {args.out_root}/*/raw.json; run compare first")
    for d in dirs:
        if not (d / "raw.json").is_file():
            raise BadInput(f"{d} has no raw.json")
        for path in render_all(d):
            print(f"wrote {path}")
    return 0


def _add_conform(sub: argparse._SubParsersAction) -> None:
    from openclaw_ref.conformance.cluster import CHECKS
    from openclaw_ref.conformance.settings import ConformSettings
    from openclaw_ref.sync import STRATEGIES
    from openclaw_ref.sync.base import Planner, Wire

    p = sub.add_parser("conform", help="run the conformance checks on a live process group "
                                       "(under torchrun: this job's; else --world-size ranks)")
    p.add_argument("--sync", default="hardened", choices=sorted(STRATEGIES))
    p.add_argument("--wire", default="native", choices=[w.value for w in Wire])
    p.add_argument("--scale", default="4096")
    p.add_argument("--planner", default="static", choices=[k.value for k in Planner])
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--replica-check-every", type=int, default=2, metavar="K")
    p.add_argument("--watchdog-s", type=float, default=60.0)
    p.add_argument("--checks", default=",".join(CHECKS),
                   help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--faults", default=",".join(ConformSettings().faults),
                   help="faults the fault-detection check injects (NAME[=VALUE][@RANK][:STEP])")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn outside torchrun")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--out", default=None, help="write the results JSON here (rank 0)")
    p.set_defaults(func=_cmd_conform)


def _cmd_conform(args: argparse.Namespace) -> int:
    from openclaw_ref.conformance.cluster import CHECKS, conform_rank
    from openclaw_ref.conformance.report import ConformanceReport
    from openclaw_ref.conformance.settings import CheckResult, ConformSettings
    from openclaw_ref.core.config import TRAIN_PRESETS
    from openclaw_ref.core.faults import parse_fault
    from openclaw_ref.core.launch import LaunchConfig, launch
    from openclaw_ref.reporting.render import conformance_results_table
    from openclaw_ref.sync.base import SyncConfig
    from openclaw_ref.sync.errors import EXIT_CHECK_FIRED

    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown or not checks:
        raise BadInput(f"unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    for f in faults:
        parse_fault(f)
    if args.steps < 3:
        raise BadInput("conform needs --steps >= 3 (faults act at step 1 or 2)")
    sync = SyncConfig(name=args.sync, wire=args.wire, scale=args.scale, planner=args.planner,
                      bucket_cap_mb=args.bucket_cap_mb,
                      replica_check_every=args.replica_check_every, watchdog_s=args.watchdog_s)
    train = dataclasses.replace(TRAIN_PRESETS["conformance"], steps=args.steps)
    settings = ConformSettings(sync=sync, train=train, faults=faults)
    cfg = LaunchConfig(args.world_size, backend=args.backend, timeout_s=args.timeout_s,
                       pg_timeout_s=max(30.0, args.watchdog_s * 2))
    replies = launch(conform_rank, cfg, settings, checks)
    results = [CheckResult(**r) for r in replies[0]]
    import os

    if os.environ.get("RANK", "0") == "0":
        print(conformance_results_table(results))
        if args.out:
            ConformanceReport(checks=results).write(args.out)
            print(f"results JSON: {args.out}")
    return 0 if all(r.passed for r in results) else EXIT_CHECK_FIRED


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train, _add_compare,
                                                                 _add_report, _add_doctor,
                                                                 _add_conform]


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
    from openclaw_ref.core.launch import exit_process

    exit_process(main())
