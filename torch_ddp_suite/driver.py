"""One of PyTorch's DDP tests in one arm: ``python -m torch_ddp_suite.driver TEST ARM OUT``.

Driven as PyTorch's ``test/distributed/test_distributed_spawn.py`` drives it: a
``TestDistBackend`` subclass of ``_DistTestBase`` whose ``setUp`` spawns the ranks (env
``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, set by ``run.py``). The ranks are spawned processes
that import this module again (as ``__mp_main__``): in the ``hardened`` arm, there and only
there (``__name__ == "__mp_main__"``), ``DistributedDataParallel.__init__`` is
wrapped so that every DDP a test constructs is handed to ``harden()`` with its defaults as its
constructor returns. The library is imported unchanged; a copy or an unpickled DDP (which
``__init__`` does not build) is not hardened, as for a user.

The outcome is written to ``OUT`` as JSON (``outcome``, ``detail``)."""

from __future__ import annotations

import functools
import json
import os
import sys
import unittest

from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

from torch_ddp_suite.run import exception_line

ARM_ENV = "TORCH_DDP_SUITE_ARM"
WITNESS_ENV = "TORCH_DDP_SUITE_WITNESS"  # a file: one line per DDP hardened, by any rank


def harden_every_ddp() -> None:
    """Wrap ``DistributedDataParallel.__init__``: ``harden(ddp)`` as it returns, and a line
    in the witness file, so the record shows the arm hardened what the test built."""
    from openclaw_ref.sync import harden

    original = DistributedDataParallel.__init__
    witness = os.environ[WITNESS_ENV]

    @functools.wraps(original)
    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        harden(self)
        with open(witness, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")

    DistributedDataParallel.__init__ = init


# a spawned rank runs this module as "__mp_main__" (while it is imported there,
# ``multiprocessing.parent_process()`` is not set yet); the driver itself runs as "__main__"
if __name__ == "__mp_main__" and os.environ.get(ARM_ENV) == "hardened":
    harden_every_ddp()


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


def outcome_of(result: unittest.TestResult) -> tuple[str, str]:
    """The one test's outcome and, where it did not pass, the last line of its traceback
    (where a rank's traceback is quoted, the exception line of it)."""
    for kind, items in (("failed", result.failures), ("error", result.errors)):
        if items:
            return kind, exception_line(items[0][1])
    if result.skipped:
        return "skipped", result.skipped[0][1]
    return ("passed", "") if result.wasSuccessful() else ("error", "no result")


def main(argv: list[str]) -> int:
    test, arm, out = argv
    os.environ[ARM_ENV] = arm
    result = unittest.TextTestRunner(verbosity=2).run(TestDistBackendWithSpawn(test))
    outcome, detail = outcome_of(result)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"outcome": outcome, "detail": detail}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
