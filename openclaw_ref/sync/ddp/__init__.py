"""``harden()`` on DistributedDataParallel (and the composable ``replicate()``, DDP inside): the
step guard (default), the per-bucket guard (forensic mode), and what they set on the model."""
