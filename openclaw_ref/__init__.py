"""openclaw-sync: a benchmark and conformance suite for gradient synchronization of a dynamically
sparse model under data-parallel training.

Rooms, each named for what it holds:

  ``sync/``          the hook library: ``harden(ddp)`` and only what it runs; imports only torch
                     and ``sync`` itself (``tests/test_sync_standalone.py`` proves it)
  ``arms/``          the benchmark's arms beside it: stock DDP, PyTorch's hooks, ``harden()``,
                     the seed's fixes, by their ``--sync`` name
  ``core/``          the model, data, training loop and its callback protocol, run config,
                     launcher and rank pools, fault injectors
  ``conformance``    the checks behind ``pytest -m conformance`` and ``openclaw-bench conform``,
                     the fault x strategy matrix, the suite's tests (``suite/``) and its pytest
                     plugin, which points them at a user's model and comm hook; its folder is
                     ``conformance/`` at the top of the repository, installed as
                     ``openclaw_ref.conformance`` (pyproject's ``package-dir``)
  ``experiments/``   what ``openclaw-bench compare`` measures: one module per section
  ``bench/``         the benchmark jobs behind asv (``benchmarks/``)
  ``reporting/``     the run record (``raw.json``), every table and plot, the claims ledger
  ``ops/``           the environment doctor, the Prometheus exporter and the P2 skew barrier
  ``integrations/``  Lightning
  ``cli/``           ``openclaw-bench``, the one entry point

Everything outside ``sync/`` builds on it; ``arms/`` and ``core/`` build on ``sync/``; the rest
build on them, floor by floor, every import pointing down and none in a circle
(docs/layout.md's floors, checked by ``tests/test_layers.py``).
"""
