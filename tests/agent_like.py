"""torchrun's agent as far as a failing run is concerned, repeated in one process: each
repetition forks the ranks from this parent, which imported torch once (no interpreter start per
rank), gives them torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT`` on loopback), runs the real CLI in each, and as soon as one exits
non-zero sends SIGTERM to the others — what torchrun's agent does, here at once rather than
after its 0.1 s monitor interval. Past ``--deadline-s`` every rank is killed.

    python tests/agent_like.py --world-size 2 --reps 10 --out-dir DIR -- train ... --out {out}

``{out}`` in the arguments becomes ``DIR/rep<i>/run.json``. One JSON line per repetition: each
rank's exit status (negative: the signal), the rank that exited first, the ranks sent SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch.distributed  # noqa: F401 - imported once, before the ranks are forked

import openclaw_ref.arms.registry  # noqa: F401
import openclaw_ref.core.train  # noqa: F401 - what ``train`` imports, imported once too
import openclaw_ref.reporting.render  # noqa: F401
from openclaw_ref.cli import main as cli_main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, argv: list[str]) -> None:
    """A forked rank: torchrun's environment, the CLI, and never a return into the parent."""
    code = 1
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        code = cli_main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def repetition(world: int, argv: list[str], deadline_s: float) -> dict:
    port = _free_port()
    pids: dict[int, int] = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _rank(rank, world, port, argv)
        pids[pid] = rank

    def past_deadline(signum, frame) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, past_deadline)
    signal.alarm(int(deadline_s))
    codes: dict[int, int] = {}
    first, terminated, start = None, [], time.monotonic()
    try:
        while pids:
            pid, status = os.waitpid(-1, 0)
            rank = pids.pop(pid)
            codes[rank] = os.waitstatus_to_exitcode(status)
            first = rank if first is None else first
            if codes[rank] != 0 and not terminated:
                for other, other_rank in pids.items():
                    os.kill(other, signal.SIGTERM)
                    terminated.append(other_rank)
    finally:
        signal.alarm(0)
    return {"codes": {str(r): c for r, c in sorted(codes.items())}, "first": first,
            "terminated": sorted(terminated), "seconds": round(time.monotonic() - start, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    for i in range(args.reps):
        out = args.out_dir / f"rep{i}" / "run.json"
        result = repetition(args.world_size, [a.replace("{out}", str(out)) for a in argv],
                            args.deadline_s)
        print(json.dumps({"rep": i, **result}), flush=True)


if __name__ == "__main__":
    main()
