"""``python -m openclaw_ref.bench.gate [BASE] [HEAD]``: the regression gate (``tox -e bench-gate``).

Prints one line per job and the verdict — HEAD's excess in µs per step with its interval, and
in stock DDP steps — then what the gate's own calibration measured (``table.promise``: the
rates from ``results/gate/calibration.json``, or that they are not measured yet), so its output
promises no more than the published table shows. Exits 0 (within), 1 (slower: a regression), 5
(noisy: the host was too busy to rule out the slowdown the gate promises to see), 2 (bad
input).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from openclaw_ref.bench.gate.run import GatePlan, compare
from openclaw_ref.bench.gate.stat import Verdict
from openclaw_ref.bench.gate.stopping import StoppingRule
from openclaw_ref.bench.gate.table import CALIBRATION, promise, read_calibration
from openclaw_ref.core.jsonio import check_output_file, write_json_atomic
from openclaw_ref.sync.errors import BadInput


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openclaw_ref.bench.gate",
                                description="is HEAD's harden() slower than BASE's? Both "
                                            "measured in the same jobs beside stock DDP")
    plan = GatePlan()
    p.add_argument("base", nargs="?", default="HEAD~1", help="the commit to compare against")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit under test")
    p.add_argument("--jobs", type=int, default=plan.max_jobs,
                   help="the most jobs a run takes (it looks after 4, 6, … of them)")
    p.add_argument("--rounds", type=int, default=plan.rounds,
                   help="timed rounds per job (one step of each hardened arm each)")
    p.add_argument("--no-early-stop", action="store_true",
                   help="run every job; decide only at the last (the fixed-length rule)")
    p.add_argument("--repo", default=".", help="the git repository holding both commits")
    p.add_argument("--out", default=None, help="write the run's record (JSON) here")
    return p


def verdict_line(record: dict) -> str:
    x, old = record["excess"], record["old_rule"]
    return (f"gate: {record['verdict'].upper()} — HEAD {record['head']['sha'][:10]} adds "
            f"{x['us']:+.0f} µs [{x['low_us']:+.0f}, {x['high_us']:+.0f}] per step over BASE "
            f"{record['base']['sha'][:10]}: {x['point']:+.4f} [{x['low']:+.4f}, "
            f"{x['high']:+.4f}] of a stock DDP step ({x['stock_step_ms']:.1f} ms); flags "
            f"≥ {record['tolerance']:.3f} with the interval above 0, must see "
            f"{record['see']:.2f}; {x['jobs']} jobs × {record['plan']['rounds']} rounds, "
            f"stopped {record['stop']}; hardened ÷ ddp {old['base_over_ddp']:.3f} → "
            f"{old['head_over_ddp']:.3f}; {record['seconds'] / 60:.1f} min")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    repo = Path(args.repo)
    try:
        rule = StoppingRule.up_to(args.jobs, not args.no_early_stop)
        plan = GatePlan(rounds=args.rounds, rule=rule)
        if args.out:
            check_output_file(args.out, "--out")
        print(f"gate: {args.base} → {args.head}, up to {plan.max_jobs} jobs × {plan.rounds} "
              f"rounds, looking after {', '.join(map(str, rule.looks))} (at most "
              f"~{plan.estimate_s() / 60:.1f} min on 2 idle cores)", flush=True)
        record = compare(repo, args.base, args.head, plan, lambda m: print(m, flush=True))
    except BadInput as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_json_atomic(args.out, record)
    print(verdict_line(record), flush=True)
    if record["events"]:
        print(f"gate: the guards reported {record['events']} event(s) on a healthy job",
              flush=True)
    print(f"gate: {promise(read_calibration(repo / CALIBRATION))}", flush=True)
    return Verdict(record["verdict"]).exit_code


if __name__ == "__main__":
    sys.exit(main())
