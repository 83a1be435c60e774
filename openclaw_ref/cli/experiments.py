"""The stand-alone experiments, each one job on this machine: ``openclaw-bench hook-cost`` (what
a comm hook costs, arms interleaved), ``openclaw-bench verify-scale`` (what checking a step's
control blocks costs at 8 to 8,192 ranks) and ``openclaw-bench p2`` (text 000's skew barrier).
The same figures come out of ``openclaw-bench compare``; these print them alone."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial

from openclaw_ref.cli.choices import HOOK_COST_ARMS
from openclaw_ref.sync.errors import BadInput


def add_hook_cost(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hook-cost", help="per-step cost of each comm hook beside stock DDP, "
                                         "arms interleaved step by step in one job")
    p.add_argument("--model", default="mlp", help="mlp, or an openclaw preset such as tiny")
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn (>= 2)")
    p.add_argument("--steps", type=int, default=150, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per arm")
    p.add_argument("--arms", default=",".join(HOOK_COST_ARMS),
                   help="comma-separated subset (must include ddp, the baseline)")
    p.add_argument("--out", default=None, help="write the result JSON here (else print it)")
    p.set_defaults(func=_cmd_hook_cost)


def _cmd_hook_cost(args: argparse.Namespace) -> int:
    from openclaw_ref.core.jsonio import check_output_file, write_json_atomic
    from openclaw_ref.experiments.hook_cost import HookCostConfig, run

    cfg = HookCostConfig(model=args.model, world_size=args.world_size, steps=args.steps,
                         warmup=args.warmup, arms=tuple(args.arms.split(",")))
    if args.out:
        check_output_file(args.out, "--out")
    result = run(cfg)
    for arm, s in result["summary"].items():
        print(f"{arm:20s} {s['median_step_ms']:8.2f} ms  ×{s['ratio']:.3f} "
              f"[{s['ratio_low']:.3f}, {s['ratio_high']:.3f}]  {s['per_bucket_us']:7.1f} µs/bucket "
              f"({s['buckets']} buckets)")
    for pair in result["pairs"]:
        print(f"{pair['arm']} ÷ {pair['over']}: {pair['ratio']:.3f} "
              f"[{pair['ratio_low']:.3f}, {pair['ratio_high']:.3f}]")
    if args.out:
        write_json_atomic(args.out, result)
    else:
        json.dump(result["summary"], sys.stdout, indent=1)
    return 0


def _add_printing_command(sub: argparse._SubParsersAction, name: str, help_text: str,
                          rows: Callable[[], Iterable[object]]) -> None:
    """A command without options that prints each of ``rows()`` on a line (``rows`` imports
    torch, after the arguments are parsed)."""
    sub.add_parser(name, help=help_text).set_defaults(func=partial(_print_rows, rows))


def _print_rows(rows: Callable[[], Iterable[object]], args: argparse.Namespace) -> int:
    for row in rows():
        print(row)
    return 0


def add_verify_scale(sub: argparse._SubParsersAction) -> None:
    _add_printing_command(sub, "verify-scale", "cost of checking a step's control blocks at 8 "
                          "to 8,192 ranks and 16 to 1,024 buckets, per-rank and counted "
                          "(synthesized blocks, one process)", _verify_scale_rows)


def _verify_scale_rows() -> Iterator[object]:
    from openclaw_ref.experiments.verify_scale import measure, measure_counts
    from openclaw_ref.reporting.control_counts_tables import counted_block_table

    yield from measure()
    yield counted_block_table(measure_counts()).markdown()


def add_startup_scale(sub: argparse._SubParsersAction) -> None:
    _add_printing_command(sub, "startup-scale", "bytes each rank receives from harden()'s "
                          "start-up check at 8 to 8,192 ranks, before and after the digest-first "
                          "exchange (arithmetic, no ranks)", _startup_scale_rows)


def _startup_scale_rows() -> Iterator[object]:
    from openclaw_ref.experiments.startup_scale import measure

    yield from measure((8, 64, 512, 1024, 4096, 8192))


def add_p2(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("p2", help="text 000's P2 skew barrier off and on, interleaved "
                                  "(hardened fp32, tiny preset)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn")
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved off/on pairs")
    p.add_argument("--threshold-ms", type=float, default=1.5,
                   help="barrier when the across-rank std of the sync time exceeds this")
    p.add_argument("--jitter-ms", default="0.3,5.7", help="LOW,HIGH per-rank sleep; 0 = none")
    p.set_defaults(func=_cmd_p2)


def _cmd_p2(args: argparse.Namespace) -> int:
    from openclaw_ref.experiments.p2bench import measure_skew_barrier, summarize
    from openclaw_ref.reporting.render import p2_table

    try:
        jitter = (None if args.jitter_ms in ("0", "")
                  else tuple(float(x) for x in args.jitter_ms.split(",")))
    except ValueError:
        raise BadInput(f"--jitter-ms must be LOW,HIGH; got {args.jitter_ms!r}") from None
    if jitter is not None and len(jitter) != 2:
        raise BadInput(f"--jitter-ms must be LOW,HIGH; got {args.jitter_ms!r}")
    result = measure_skew_barrier(args.world_size, args.steps, args.repeats, args.threshold_ms,
                                  jitter)
    print(f"P2 skew barrier, hardened fp32, tiny, W={args.world_size}, {args.steps} steps × "
          f"{args.repeats} repeats (interleaved), jitter {jitter or 'none'} ms, threshold "
          f"{args.threshold_ms} ms; medians over repeats of per-run medians (2 warm-up steps out)")
    print(p2_table(summarize(result)))
    return 0
