"""``openclaw-bench train``: one configuration on N ranks (spawned, or this torchrun job)."""

from __future__ import annotations

import argparse
import os

from openclaw_ref.cli.choices import BACKENDS, PRESETS
from openclaw_ref.cli.sync_args import add_sync_arguments, sync_config_from_args
from openclaw_ref.sync.errors import BadInput


def _ratio_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH in [0, 1); got {text!r}") from None
    return lo, hi


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the openclaw model on N ranks and print a summary")
    p.add_argument("--preset", default="tiny", choices=PRESETS, help="model size")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks to spawn (None: 2; under torchrun: its WORLD_SIZE)")
    p.add_argument("--steps", type=int, default=50, help="training steps")
    p.add_argument("--global-batch", type=int, default=32,
                   help="samples per step over all ranks (a multiple of the world size)")
    p.add_argument("--seed", type=int, default=1, help="seed of the model, data and masks")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"], help="optimizer")
    p.add_argument("--sparsity", type=_ratio_range, default=None, metavar="LOW,HIGH",
                   help="range of the masked fraction per step (None: text 000's 0.12,0.68)")
    add_sync_arguments(p, sync="ddp", replica_check_every=0)
    p.add_argument("--inject", action="append", default=[], metavar="NAME[=VALUE][@RANK][:STEP]",
                   help="inject a fault (repeatable)")
    p.add_argument("--imbalance", type=float, default=1.0,
                   help="most ÷ least frequent skill label (1 = balanced)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: nccl with one GPU per rank, else gloo")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="the whole run's deadline (exit 4 past it)")
    p.add_argument("--eval-every", type=int, default=10,
                   help="validation loss every N steps (0: only at the end)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr")
    p.add_argument("--verbose", action="store_true",
                   help="after a failure's one-line summary, print the failing rank's "
                        "traceback and, past the deadline, each unfinished rank's stacks "
                        "(without it: the folder of the stacks)")
    p.add_argument("--out", default=None, help="write the run JSON here (rank 0)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on HOST:PORT+rank (0: a free port per "
                        "rank, logged); needs the metrics extra")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address the metrics endpoints bind to (loopback by default; 0.0.0.0 "
                        "lets a remote Prometheus scrape a multi-node job)")
    p.add_argument("--skew-barrier-ms", type=float, default=None, metavar="MS",
                   help="text 000's P2: barrier before the next backward when the across-rank "
                        "std of the sync time exceeds MS (text 000 used 1.5); None: off")
    p.set_defaults(func=_cmd_train)


def train_config_from_args(args: argparse.Namespace):
    """Build and validate a TrainConfig from parsed arguments (raises BadInput)."""
    from openclaw_ref.core.config import MetricsConfig
    from openclaw_ref.core.data import DataConfig
    from openclaw_ref.core.faults import parse_fault
    from openclaw_ref.core.launch import under_torchrun
    from openclaw_ref.core.train import TrainConfig

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
        sync=sync_config_from_args(args),
        data=data, faults=tuple(parse_fault(f) for f in args.inject), backend=args.backend,
        metrics=MetricsConfig(port=args.metrics_port, host=args.metrics_host,
                              skew_barrier_ms=args.skew_barrier_ms),
        timeout_s=args.timeout_s, progress=not args.no_progress, out=args.out,
    )
    cfg.validate()
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from openclaw_ref.core.launch import LaunchConfig
    from openclaw_ref.core.train import run_training
    from openclaw_ref.ops.prometheus import metrics_callbacks
    from openclaw_ref.reporting.render import train_summary_table

    cfg = train_config_from_args(args)
    LaunchConfig(cfg.world_size, backend=cfg.backend)  # backend and size checked before spawning
    record = run_training(cfg, metrics=metrics_callbacks)
    if record is not None:
        print(train_summary_table(record))
        if args.out:
            print(f"run JSON: {args.out}")
        return 3 if record["events"] else 0
    return 0

