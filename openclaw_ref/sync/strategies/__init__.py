"""The suite's own gradient-synchronization strategies (``--sync NAME``): stock DDP as the
baseline, the hardened strategy, the bucketed engine of the seed's F2, the seed's F5 hook, local.
Not what users import to guard their own jobs: that is ``openclaw_ref.sync.hardening``."""
