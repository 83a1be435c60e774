"""``python -m torch_ddp_suite`` (``tox -e torch-ddp-suite``): PyTorch's own DDP tests, stock
and hardened, into ``torch_ddp_suite/record.json`` and docs/setups.md's table.

``--resume`` keeps the record's finished runs; ``--tests a,b`` reruns only those;
``--arms stock`` runs one arm; ``--render`` only re-renders the table from the record."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openclaw_ref.core.jsonio import read_json
from torch_ddp_suite.render import publish
from torch_ddp_suite.run import ROOT, Arm, new_record, run_all

RECORD = ROOT / "torch_ddp_suite" / "record.json"
PAGE = ROOT / "docs" / "setups.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_ddp_suite", description=__doc__)
    p.add_argument("--arms", default="stock,hardened")
    p.add_argument("--tests", default="", help="comma-separated test names: rerun only those")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds per test and arm")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--render", action="store_true")
    p.add_argument("--record", type=Path, default=RECORD)
    a = p.parse_args(argv)
    if a.render:
        publish(read_json(a.record), PAGE)
        return 0
    arms = [Arm(x) for x in a.arms.split(",") if x]
    only = {t for t in a.tests.split(",") if t} or None
    if a.resume or only:
        record = read_json(a.record)
    else:
        import os

        os.environ.setdefault("BACKEND", "gloo")  # read when PyTorch's test module is imported
        os.environ.setdefault("WORLD_SIZE", "2")
        import torch
        from torch.testing._internal.distributed.distributed_test import DistributedTest

        from torch_ddp_suite.selection import ddp_tests

        record = new_record(ddp_tests(DistributedTest._DistTestBase, torch.cuda.is_available()),
                            a.deadline)
    run_all(record, arms, a.record, a.deadline, only)
    publish(record, PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
