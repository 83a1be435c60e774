"""PyTorch's own DDP tests run against ``harden()``: ``tox -e torch-ddp-suite``.

The tests PyTorch ships in its wheel for ``DistributedDataParallel``
(``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``) are the
specification of the object ``harden()`` wraps. This runner drives them the way PyTorch's own
``test/distributed/test_distributed_spawn.py`` does (gloo, 2 ranks), each in a subprocess of
its own with a deadline, in two arms: as shipped (``stock``), and with every
``DistributedDataParallel`` the ranks construct passed to ``harden()`` with its defaults right
after construction (``hardened``). The record (``record.json`` here) holds every DDP test, the
ones that need a GPU or that PyTorch skips itself named as such; docs/setups.md's table is
rendered from it, never typed.

Not part of the package (``openclaw_ref``) nor of CI's default ``tests`` env: a measurement,
slow (a spawn per test and arm), run by hand. The library under test is imported unchanged;
the hardened arm's wrap lives in this folder's driver and runs in the spawned ranks only.

Modules: which tests and why (``selection.py``), one test in one arm (``driver.py``), every
test with a deadline and the record (``run.py``), the table (``render.py``), the command
(``__main__.py``)."""
