"""The sections of ``openclaw-bench compare``, one module each.

Every module exposes ``run(cfg, pools, progress) -> dict`` (``strategies.run`` also takes the
variants) returning figures only — numbers, names, flags and the measured outcomes; captions
and tables come from ``reporting.section_tables``. ``NAMES`` is their run order, the one list
``CompareConfig`` and the registry read; ``experiments.registry`` maps each name to its runner.
"""

NAMES = ("strategies", "curves", "faults", "corpus", "false_alarms", "precision", "overflow",
         "raw_allreduce", "ablations", "lightning", "quantization", "hook_cost", "sdc",
         "fsdp_cost", "fsdp_corpus", "tp_corpus")
