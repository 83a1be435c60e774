"""One live rank pool per world size, shared by a whole comparison or a whole test session.

A pool's ranks keep their process group and whatever their tasks imported, so a pool is made
once per world size and reused (starting one is cheap since ranks fork from a warm server,
``rank_start``; joining it, importing a task's modules and warming up are not). A pool that
saw a failure is killed by ``RankPool`` itself and replaced on the next request; the caller
never holds a broken pool.
"""

from __future__ import annotations

from openclaw_ref.core.launch import LaunchConfig, RankPool


class PoolCache:
    """Rank pools by world size, all with one backend and one pair of timeouts."""

    def __init__(self, backend: str = "gloo", timeout_s: float = 180.0,
                 pg_timeout_s: float = 60.0) -> None:
        self.backend, self.timeout_s, self.pg_timeout_s = backend, timeout_s, pg_timeout_s
        self._pools: dict[int, RankPool] = {}

    def get(self, world_size: int, timeout_s: float | None = None) -> RankPool:
        """The live pool of ``world_size`` ranks; a new one (task deadline ``timeout_s``, else
        the cache's) when none is live."""
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            pool = RankPool(LaunchConfig(world_size, backend=self.backend,
                                         timeout_s=timeout_s or self.timeout_s,
                                         pg_timeout_s=self.pg_timeout_s))
            self._pools[world_size] = pool
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
