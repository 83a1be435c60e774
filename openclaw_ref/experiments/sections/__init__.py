"""The sections of ``openclaw-bench compare``, one module each.

Every module exposes ``run(cfg, pools, progress) -> dict`` (``strategies.run`` also takes the
variants) returning figures only — numbers, names, flags and the measured outcomes; captions
and tables come from ``reporting.section_tables``. ``experiments.registry`` lists them in run
order.
"""
