"""``openclaw-bench doctor`` (the environment and NCCL variables) and ``openclaw-bench conform``
(the conformance checks on a live process group)."""

from __future__ import annotations

import argparse
import dataclasses

from openclaw_ref.cli.choices import BACKENDS, CHECKS, CONFORM_FAULTS
from openclaw_ref.cli.sync_args import add_sync_arguments, sync_config_from_args
from openclaw_ref.sync.errors import BadInput


def add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="print torch/CUDA/NCCL/gloo facts and lint NCCL variables "
                                      "(exit 5 on an environment error, or on a warning with "
                                      "--strict; 2 on bad input)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="the backend you intend to run (nccl is refused below NCCL 2.13.4)")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 5)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from openclaw_ref.ops.doctor import run_doctor

    text, code = run_doctor(backend=args.backend, strict=args.strict, as_json=args.json)
    print(text)
    return code


def add_conform(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conform", help="run the conformance checks on a live process group "
                                       "(under torchrun: this job's; else --world-size ranks)")
    add_sync_arguments(p, sync="hardened", replica_check_every=2, replica_slices=2)
    p.add_argument("--checks", default=",".join(CHECKS),
                   help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--faults", default=None,
                   help="faults the fault-detection check injects (NAME[=VALUE][@RANK][:STEP]); "
                        f"default {','.join(CONFORM_FAULTS)}. With --model/--hook: fault or "
                        "corpus-pattern names, or 'all' (default none; not under torchrun)")
    p.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                   help="check your own model: FACTORY() returns an "
                        "openclaw_ref.conformance.target.Target (the model-agnostic checks run)")
    p.add_argument("--hook", default=None, metavar="MODULE:CALLABLE",
                   help="CALLABLE(ddp_model, process_group) registers your comm hook "
                        "(default: stock DDP)")
    p.add_argument("--steps", type=int, default=6, help="training steps per check (>= 3)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn outside torchrun")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: nccl with one GPU per rank, else gloo")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="the whole run's deadline (exit 4 past it)")
    p.add_argument("--out", default=None, help="write the results JSON here (rank 0)")
    p.set_defaults(func=_cmd_conform)


def _cmd_conform(args: argparse.Namespace) -> int:
    from openclaw_ref.conformance.cluster import conform_rank
    from openclaw_ref.conformance.settings import CheckResult, ConformSettings
    from openclaw_ref.core.config import TRAIN_PRESETS
    from openclaw_ref.core.faults import parse_fault
    from openclaw_ref.core.jsonio import check_output_file
    from openclaw_ref.core.launch import LaunchConfig, launch

    if args.model or args.hook:
        return _conform_target(args)
    args.faults = ",".join(CONFORM_FAULTS) if args.faults is None else args.faults
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown or not checks:
        raise BadInput(f"unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    for f in faults:
        parse_fault(f)
    if args.steps < 3:
        raise BadInput("conform needs --steps >= 3 (faults act at step 1 or 2)")
    if args.out:
        check_output_file(args.out, "--out")
    sync = sync_config_from_args(args)
    train = dataclasses.replace(TRAIN_PRESETS["conformance"], steps=args.steps)
    settings = ConformSettings(sync=sync, train=train, faults=faults)
    cfg = LaunchConfig(args.world_size, backend=args.backend, timeout_s=args.timeout_s,
                       pg_timeout_s=max(30.0, args.watchdog_s * 2))
    replies = launch(conform_rank, cfg, settings, checks)
    return _publish([CheckResult(**r) for r in replies[0]], args.out)



def _conform_target(args: argparse.Namespace) -> int:
    """``conform --model/--hook``: the model-agnostic checks on the user's target; every input is
    imported and tried here, before any rank starts."""

    from openclaw_ref.conformance.settings import CheckResult
    from openclaw_ref.conformance.target import TargetSpec, validate_spec
    from openclaw_ref.conformance.user_checks import run_user_checks
    from openclaw_ref.conformance.user_faults import run_user_faults, user_case_names
    from openclaw_ref.core.jsonio import check_output_file
    from openclaw_ref.core.launch import LaunchConfig, launch, under_torchrun

    spec = TargetSpec(args.model, args.hook, args.world_size, args.wire)  # --wire: its tolerance
    validate_spec(spec)
    names = user_case_names(args.faults or "")
    if names and under_torchrun():
        raise BadInput("--faults with --model/--hook spawns its own ranks (a crash or a hang "
                       "ends them): run it outside torchrun")
    if args.out:
        check_output_file(args.out, "--out")
    cfg = LaunchConfig(args.world_size, backend=args.backend, timeout_s=args.timeout_s,
                       pg_timeout_s=max(30.0, args.watchdog_s * 2))
    results = [CheckResult(**r) for r in launch(run_user_checks, cfg, spec)[0]]
    return _publish(results + run_user_faults(spec, names), args.out)


def _publish(results: list, out: str | None) -> int:
    """Print the conformance table and write the report (rank 0 only under torchrun); the exit
    code says whether every check passed."""
    import os

    from openclaw_ref.conformance.report import ConformanceReport
    from openclaw_ref.reporting.render import conformance_results_table
    from openclaw_ref.sync.errors import EXIT_CHECK_FIRED

    if os.environ.get("RANK", "0") == "0":
        print(conformance_results_table(results))
        if out:
            ConformanceReport(checks=results).write(out)
            print(f"results JSON: {out}")
    return 0 if all(r.passed for r in results) else EXIT_CHECK_FIRED
