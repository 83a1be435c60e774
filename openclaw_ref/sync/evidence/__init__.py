"""The evidence every guard gathers, exchanges and judges, whatever the wrapper.

The step's control block and its counts (``control*.py``), the ledger that judges a step, the
start-up and replica checks (``checks.py``, ``replica_*.py``), was-it-averaged
(``averaged.py``), the FP16 wire (``precision.py``), the one vote (``vote.py``), the hang
watchdog and what ends a failed job (``watchdog.py``, ``heartbeat.py``, ``job_end.py``,
``outside_work.py``)."""
