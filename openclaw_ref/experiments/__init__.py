"""What ``openclaw-bench compare`` measures.

``compare.py`` is the driver (the run loop, results); ``settings.py`` the config and progress
every section is handed; ``registry.py`` maps each section name to its job count and runner;
``sections/`` holds one module per section, each returning figures only. Beside them the
experiments a section calls: ``hook_cost.py`` (what a comm hook costs, arms interleaved in one
job), ``verify_scale.py`` (checking control blocks at 8 to 8,192 ranks),
``p2bench.py`` (the seed's skew barrier), ``ddp_option_matrix.py`` (``harden()`` on a plain model
per DDP option), ``quantize.py`` (int8 after training), ``probes.py`` (recording comm hooks) and
``runs.py`` (helpers shared by sections). Run on its own (no section): ``startup_scale.py``, the
start-up check's bytes per rank at 8 to 8,192 ranks, by arithmetic (``openclaw-bench
startup-scale``).
"""
