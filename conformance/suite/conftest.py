"""The suite's Hypothesis profiles (``HYPOTHESIS_PROFILE=dev|ci|nightly``), loaded only when the
suite itself is collected."""

from openclaw_ref.conformance.suite.profiles import load_hypothesis_profiles

load_hypothesis_profiles()
