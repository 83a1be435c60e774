"""The FSDP2 adapter: ``harden()`` on ``fully_shard``, HSDP's 2-D mesh and ``replicate_with_fsdp``.

``guard.py``: the guard and its one exchange per step; ``facts.py``: the row each rank sends and
the verdict every rank reads; ``hooks.py``, ``last_words.py``, ``mesh.py``, ``scale.py``,
``close.py``: what it hooks into FSDP2 and reads from it; ``canary*.py``: the compute canary on
the full parameters."""
