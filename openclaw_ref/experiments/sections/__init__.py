"""The sections of ``openclaw-bench compare``, one module each.

Every module exposes ``run(cfg, pools, progress) -> dict`` (``strategies.run`` also takes the
variants) returning figures only — numbers, names, flags and the measured outcomes; captions
and tables are ``reporting.comparison``'s. ``experiments.registry`` lists them in run order.
"""
