"""The conformance suite's tests, shipped in the wheel so that an installed package can run them:
``pytest -m conformance --pyargs openclaw_ref.conformance.suite`` (options and fixtures:
``openclaw_ref.conformance.plugin``). In the repository ``pytest -m conformance`` collects them
from here (``testpaths``)."""
