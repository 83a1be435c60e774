"""One fault case on a rank pool, as the three fault runners (the DDP matrix, the user-hook
matrix, the FSDP2 matrix) play it: a case that may break the process group gets a fresh pool,
killed afterwards; a failure is the case's result, not an exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.launch import RankPool


def play(pool: RankPool, fresh: bool, task: Callable[..., Any], *args: Any, timeout_s: float
         ) -> tuple[Any, BaseException | None, list[int]]:
    """Rank 0's reply to ``task``, or the pool's failure (a rank failed, or the deadline) and
    the ranks that exited on their own; ``fresh``: the pool is this case's, killed after."""
    reply, failure = None, None
    try:
        reply = pool.run(task, *args, timeout_s=timeout_s)[0]
    except (RankFailed, LaunchTimeout) as exc:
        failure = exc
    finally:
        if fresh:
            pool.kill()
    return reply, failure, self_exited_ranks(pool) if failure is not None else []


def self_exited_ranks(pool: RankPool) -> list[int]:
    """Ranks of a stopped pool that exited on their own (any exit but the pool's SIGKILL).
    Reads the pool's processes: ``RankPool`` has no public exit-code accessor yet."""
    procs = getattr(pool, "_procs", [])
    return [r for r, p in enumerate(procs) if p.exitcode is not None and p.exitcode != -9]
