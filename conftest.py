"""Shared fixtures for ``tests/`` and ``conformance/``: reusable rank pools and Hypothesis profiles.

Spawning ranks is the dominant cost here (8 gloo ranks ≈ 12 s on 2 cores), so one pool per world
size lives for the whole session. A pool that saw a failure is killed by ``RankPool`` itself and
silently replaced on the next request.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from openclaw_ref.core.launch import LaunchConfig, RankPool

settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


class PoolCache:
    """One live RankPool per world size; broken pools are replaced on demand."""

    def __init__(self) -> None:
        self._pools: dict[int, RankPool] = {}

    def get(self, world_size: int, timeout_s: float = 180.0) -> RankPool:
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            pool = RankPool(LaunchConfig(world_size, backend="gloo", timeout_s=timeout_s,
                                         pg_timeout_s=60.0))
            self._pools[world_size] = pool
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


@pytest.fixture(scope="session")
def pools():
    cache = PoolCache()
    yield cache
    cache.close()
