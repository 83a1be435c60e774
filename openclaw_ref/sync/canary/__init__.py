"""The compute canary: every K steps every rank runs one probe; a rank that differs is confirmed.

``schedule.py``: when a probe runs, the compare and the confirmation's gathers (``Canary``);
``row.py``: its row, modes, events and words; ``probe.py``, ``stream.py`` and ``input.py``: the
probe, its gradient stream and its input; ``fingerprint.py``: what makes ranks' kernels differ;
``tolerance.py``: the comparison where ranks are not bitwise reproducible; ``verdict.py``: what
a confirmation concludes (docs/canary.md)."""
