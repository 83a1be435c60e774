"""Shared fixtures for ``tests/`` and ``conformance/``: reusable rank pools and Hypothesis profiles.

One ``core.pools.PoolCache`` (gloo) lives for the whole session; a pool that saw a failure is
replaced on the next request.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from openclaw_ref.core.pools import PoolCache

settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def pools():
    cache = PoolCache()
    yield cache
    cache.close()
