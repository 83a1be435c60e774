"""The regression gate (``tox -e bench-gate -- BASE HEAD``): BASE's and HEAD's ``harden()``
measured in the same jobs.

* ``trees``     — each commit's hook library extracted from git under a name of its own;
* ``job``       — one job: stock DDP and both ``harden()``s interleaved on 2 gloo ranks;
* ``stat``      — HEAD's excess in stock DDP steps, its interval, the ``Verdict``;
* ``run``       — one gate run (``jobs`` jobs) as a record;
* ``__main__``  — ``python -m openclaw_ref.bench.gate BASE HEAD``.
"""
