"""The sync-strategy flags, declared once for every subcommand that builds an ``ArmConfig``
(``train``, ``conform``): the same names, choices and help, and one translation back."""

from __future__ import annotations

import argparse

from openclaw_ref.cli.choices import (
    GUARDS,
    NONFINITE_POLICIES,
    PLANNERS,
    STRATEGIES,
    WATCHDOG_ACTIONS,
    WIRES,
)


def add_sync_arguments(p: argparse.ArgumentParser, *, sync: str, replica_check_every: int,
                       replica_slices: int | None = None) -> None:
    """The flags of ``ArmConfig``; ``sync``, ``replica_check_every`` and ``replica_slices``
    are the subcommand's own defaults (conformance compares replicas within 2 steps, so that
    its short runs judge the faults they inject; None: ``SyncConfig``'s)."""
    p.add_argument("--sync", default=sync, choices=STRATEGIES,
                   help="gradient-synchronization strategy")
    p.add_argument("--guard", default="step", choices=GUARDS,
                   help="hardened: one small exchange per step with the gradients on DDP's own "
                        "C++ path (step, the default), or the per-bucket comm hook (bucket: "
                        "forensic; needed for a bf16 wire or an fp16 pre-scale)")
    p.add_argument("--wire", default="native", choices=WIRES,
                   help="dtype a bucket travels as (hardened/bucketed)")
    p.add_argument("--scale", default="loss-scaler",
                   help="FP16 pre-scale: loss-scaler (default: none, as fp16_compress_hook; "
                        "right with or without GradScaler), or, for jobs with no loss "
                        "scaler, a power of two or auto")
    p.add_argument("--nonfinite", default="skip", choices=NONFINITE_POLICIES,
                   help="a rank's NaN/inf gradient: skip the step on every rank, or raise")
    p.add_argument("--planner", default="static", choices=PLANNERS,
                   help="the bucketed engine's bucket plan")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size cap (MB)")
    p.add_argument("--replica-check-every", type=int, default=replica_check_every, metavar="K",
                   help="bucketed: compare the replicas' parameters every K steps (0: never)")
    p.add_argument("--replica-slices", type=int, default=replica_slices, metavar="K",
                   help="hardened: every parameter's replica compared within K steps, one "
                        "slice per step in the step's control block, and all of them when the "
                        "run ends (1: all every step; 0: off; default here: "
                        + (str(replica_slices) if replica_slices is not None else "harden()'s")
                        + ")")
    p.add_argument("--canary-every", type=int, default=0, metavar="K",
                   help="hardened (step guard, DDP): every K steps every rank runs the same "
                        "small probe and a rank whose gradients differ is named "
                        "(ComputeMismatch); 0: off (the default); 256 is the recommended K")
    p.add_argument("--watchdog-s", type=float, default=60.0,
                   help="a bucket's allreduce unfinished this long gets a diagnosis of the "
                        "late ranks")
    p.add_argument("--watchdog-action", default="raise", choices=WATCHDOG_ACTIONS,
                   help="after the diagnosis: raise in the training thread if the collective "
                        "failed or a late rank is silent, report only, or exit 4")


def sync_config_from_args(args: argparse.Namespace):
    """The ``ArmConfig`` the flags of ``add_sync_arguments`` describe (raises BadInput)."""
    from openclaw_ref.arms.config import ArmConfig

    slices = {} if args.replica_slices is None else {"replica_slices": args.replica_slices}
    return ArmConfig.of(args.sync, wire=args.wire, scale=args.scale, planner=args.planner,
                        nonfinite=args.nonfinite, bucket_cap_mb=args.bucket_cap_mb,
                        replica_check_every=args.replica_check_every, watchdog_s=args.watchdog_s,
                        watchdog_action=args.watchdog_action, guard=args.guard,
                        canary_every=args.canary_every, **slices)
