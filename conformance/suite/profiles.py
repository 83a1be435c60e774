"""The suite's Hypothesis profiles, shared by its conftest and the repository's."""

from __future__ import annotations

import os


def load_hypothesis_profiles() -> None:
    """Register the ``dev``/``ci``/``nightly`` profiles and load ``$HYPOTHESIS_PROFILE``'s
    (default ``dev``). Called by the suite's and the repository's conftest."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("dev", max_examples=10, deadline=None)
    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                              print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("nightly", max_examples=500, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
