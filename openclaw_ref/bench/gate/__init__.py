"""The regression gate (``tox -e bench-gate -- BASE HEAD``) and its calibration
(``tox -e gate-calibrate``): BASE's and HEAD's ``harden()`` measured in the same jobs.

* ``trees``     — each commit's hook library extracted from git under a name of its own;
* ``job``       — one job: stock DDP and both ``harden()``s interleaved on 2 gloo ranks;
* ``stat``      — HEAD's excess in stock DDP steps, its interval, the ``Verdict``;
* ``run``       — one gate run (``jobs`` jobs) as a record;
* ``__main__``  — ``python -m openclaw_ref.bench.gate BASE HEAD``;
* ``plant``     — the calibration's scratch commits: a comment, a planted busy-wait;
* ``calibrate`` — the gate's own error rates, run after run, resumable;
* ``table``     — the published table, rendered from the calibration's record.
"""
