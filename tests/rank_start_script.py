"""A parent process for ``test_rank_start``: it starts rank pools the way a user's script does,
and does to its own streams or life what the test names.

``streams OUT_A OUT_B``: a first pool starts (and with it the fork server) while the parent's
stderr is file A; the parent then points its stderr at file B and starts a second pool whose
rank writes a line to stderr. ``orphan``: a pool starts, its rank pids and the server's are
printed, and the parent waits to be killed.
"""

from __future__ import annotations

import os
import sys
import time

import psutil

from openclaw_ref.core.launch import LaunchConfig, RankPool


def say_on_stderr(ctx, text: str) -> None:
    sys.stderr.write(f"{text} from rank {ctx.rank}\n")
    sys.stderr.flush()


def point_stderr_at(path: str) -> None:
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)


def streams(first: str, second: str) -> None:
    point_stderr_at(first)
    with RankPool(LaunchConfig(1, backend="gloo")) as pool:
        pool.run(say_on_stderr, "started")
    point_stderr_at(second)
    with RankPool(LaunchConfig(1, backend="gloo")) as pool:
        pool.run(say_on_stderr, "hello")


def orphan() -> None:
    pool = RankPool(LaunchConfig(2, backend="gloo"))
    ranks = pool.pids
    servers = {psutil.Process(pid).ppid() for pid in ranks} - {os.getpid()}
    print(" ".join(str(pid) for pid in [*ranks, *servers]), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "streams":
        streams(sys.argv[2], sys.argv[3])
    else:
        orphan()
