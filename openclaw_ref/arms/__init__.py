"""The benchmark's arms, beside the hook library: the baselines, ``harden()``, the seed's fixes.

Stock DDP and PyTorch's own hooks as baselines, ``harden()`` as a user gets it, and the seed's
fixes under test (the bucketed engine of its F2, its F5 hook), each built by its ``--sync``
name from an ``ArmConfig``.

Not what users import to guard their own jobs (that is ``openclaw_ref.sync``, which imports
nothing of this package): ``registry.py`` names the arms (``STRATEGIES``, ``make_strategy``),
``strategy.py`` is the interface the training loop drives, ``config.py`` what an arm runs with;
``ddp.py`` (stock DDP and PyTorch's hooks), ``detail.py`` (``TORCH_DISTRIBUTED_DEBUG=DETAIL``),
``hardened.py`` (``harden()``), ``local.py`` (no sync), ``bucketed.py`` and ``bucket_plan.py``
(the engine and its plans, checked by the per-rank control blocks of ``blocks.py``),
``seed_f5.py`` (the F5 hook as written), ``costs.py`` (exact per-step costs)."""
