"""The repository's pytest set-up for ``tests/`` and the conformance suite: the suite's plugin
(fixtures ``pools``, ``conformance_report``, ``target_spec`` and the ``--openclaw-*`` options;
an installed wheel loads it through its ``pytest11`` entry point, registered under this same
name so it loads once) and the Hypothesis profiles.
"""

from openclaw_ref.conformance.suite.profiles import load_hypothesis_profiles

pytest_plugins = ["openclaw_ref.conformance.plugin"]

load_hypothesis_profiles()
