"""``harden()`` on FSDP2: ``fully_shard`` on a 1-D mesh, HSDP's 2-D mesh,
``replicate_with_fsdp``."""
