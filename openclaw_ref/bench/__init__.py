"""Benchmark jobs: one multi-rank job per (strategy, world size), and every figure it yields.

The asv suite in ``benchmarks/`` and ``openclaw-bench compare`` both call this package, so a
number means the same thing wherever it is published. One module per concern:

* ``settings``   — ``BenchSettings`` (the ``OPENCLAW_BENCH_*`` knobs), the benchmark labels
  (``STRATEGY_CASES``, ``PRECISIONS``, ``WIRE_DTYPES``) and which backend a case runs on;
* ``figures``    — pure figure arithmetic: algbw, busbw, medians, skew percentiles, wire bytes;
* ``rank_tasks`` — the functions a job runs on every rank (raw allreduce, cost probe);
* ``jobs``       — ``Case`` and the jobs themselves (``run_sync_case``, ``run_seed004_case``);
* ``cache``      — the job cache (``CaseCache``, ``case_figures``), how asv shares one job;
* ``targets``    — the asv ``Targets`` rows, reported and never asserted;
* ``matrix``     — every case of the matrix without asv (``run_matrix``);
* ``cli``        — ``python -m openclaw_ref.bench``.
"""
