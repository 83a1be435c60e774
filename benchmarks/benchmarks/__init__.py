"""asv benchmarks of gradient synchronization (see ``common.py`` for how jobs are shared)."""
