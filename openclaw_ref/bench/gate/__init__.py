"""The regression gate (``tox -e bench-gate -- BASE HEAD``) and its calibration
(``tox -e gate-calibrate``): BASE's and HEAD's ``harden()`` measured in the same jobs.

* ``trees``     — each commit's hook library extracted from git under a name of its own;
* ``job``       — one job: both ``harden()``s (and stock DDP, the unit) interleaved on 2 ranks;
* ``stat``      — HEAD's excess in µs and in stock DDP steps, its interval, the ``Verdict``;
* ``stopping``  — when a run stops: early when clearly inside or beyond, and the error it costs;
* ``run``       — one gate run (job after job on one pair of ranks) as a record;
* ``__main__``  — ``python -m openclaw_ref.bench.gate BASE HEAD``;
* ``plant``     — the calibration's scratch commits: a comment, a planted busy-wait;
* ``calibrate`` — the gate's own error rates, run after run, resumable;
* ``table``     — what the gate says about itself, rendered from the calibration's record.
"""
