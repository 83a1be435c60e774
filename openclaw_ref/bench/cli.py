"""``python -m openclaw_ref.bench``: the asv benchmark matrix without asv, as JSON and markdown.

Run without asv: ``python -m openclaw_ref.bench --max-world 4 --out bench.json``. Defaults come
from the same ``OPENCLAW_BENCH_*`` variables asv reads.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from openclaw_ref.bench.cache import CaseCache
from openclaw_ref.bench.matrix import run_matrix
from openclaw_ref.bench.settings import STRATEGY_CASES, BenchSettings
from openclaw_ref.cli import OneLineParser
from openclaw_ref.core.jsonio import (
    check_output_dir,
    check_output_file,
    write_json_atomic,
    write_text_atomic,
)
from openclaw_ref.sync.errors import BadInput


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(prog="python -m openclaw_ref.bench",
                                description="the asv benchmark matrix without asv, as JSON")
    defaults = BenchSettings.from_env()
    p.add_argument("--preset", default=defaults.preset, help="model size")
    p.add_argument("--steps", type=int, default=defaults.steps,
                   help="steps per run (2 warm-up + timed)")
    p.add_argument("--global-batch", type=int, default=defaults.global_batch,
                   help="samples per step over all ranks")
    p.add_argument("--max-world", type=int, default=defaults.max_world,
                   help="largest world size of the matrix")
    p.add_argument("--backends", default=defaults.backends, help="auto, or a list of gloo,nccl")
    p.add_argument("--raw-iters", type=int, default=defaults.raw_iters,
                   help="iterations of the raw allreduce floor")
    p.add_argument("--rounds", type=int, default=defaults.rounds,
                   help="strategy/floor runs alternate this often in one job")
    p.add_argument("--threads", type=int, default=defaults.threads,
                   help="torch threads per rank (0: cores // ranks)")
    p.add_argument("--strategies", default=",".join(STRATEGY_CASES),
                   help="comma list of benchmark labels; empty for none")
    p.add_argument("--no-seed004", action="store_true", help="skip text 004's precision cases")
    p.add_argument("--cache-dir", default=None, help="keep per-case JSON here (resumable)")
    p.add_argument("--out", default=None, help="write the matrix JSON here")
    p.add_argument("--markdown", default=None, help="write the tables here")
    args = p.parse_args(argv)
    try:
        settings = BenchSettings(preset=args.preset, steps=args.steps,
                                 global_batch=args.global_batch, max_world=args.max_world,
                                 backends=args.backends, raw_iters=args.raw_iters,
                                 rounds=args.rounds, threads=args.threads)
        for path, flag in ((args.out, "--out"), (args.markdown, "--markdown")):
            if path:
                check_output_file(path, flag)
        if args.cache_dir:
            check_output_dir(args.cache_dir, "--cache-dir")
    except BadInput as exc:
        p.error(str(exc))
    result = run_matrix(settings, [s for s in args.strategies.split(",") if s],
                        seed004=not args.no_seed004,
                        progress=lambda m: print(m, file=sys.stderr, flush=True),
                        cache=CaseCache(args.cache_dir) if args.cache_dir else None)
    from openclaw_ref.reporting.render import bench_matrix_markdown

    tables = bench_matrix_markdown(result)
    if args.out:
        write_json_atomic(args.out, result)
    if args.markdown:
        write_text_atomic(args.markdown, tables)
    print(tables)
    return 1 if result["failed"] else 0
