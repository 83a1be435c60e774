"""The DDP adapter: ``harden()`` on a ``DistributedDataParallel`` model or ``replicate()``'s DDP.

``step_guard.py``: the default guard, one small exchange per step beside DDP's own C++
reduction (``step_setup.py``: what it sets on the model); ``bucket_guard.py`` and
``harden_state.py``: the per-bucket guard (forensic mode); ``ddp_guard.py``: what the two share;
``replicate.py``: the DDP inside a module given to the composable ``replicate()``."""
