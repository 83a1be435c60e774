"""The declared floors are the tested ones, and a DDP user's ``harden()`` needs nothing of FSDP2.

``harden()`` on a DDP model must run on a torch whose FSDP2 is missing or moved (before torch 2.6
``FSDPModule`` was not public; ``fsdp/hooks.py`` names the private ``_fully_shard._fsdp_api``):
a fresh interpreter that cannot import the hook library's FSDP2 adapter at all hardens a DDP
model, trains and closes, and ``from openclaw_ref.sync import harden`` loads no
``torch.distributed.fsdp``. And the torch floor pyproject declares is the one tox's
``torch-floor`` environment runs the hook library's unit tests on (README: the tested matrix).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

# One rank: the point is what gets imported, not the collectives. The finder refuses every
# module of the FSDP2 adapter, as a torch without FSDP2 would make it fail.
WITHOUT_FSDP_ADAPTER = r"""
import importlib.abc, json, os, sys, tempfile

class NoFSDPAdapter(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "openclaw_ref.sync.fsdp" or name.startswith("openclaw_ref.sync.fsdp."):
            raise ImportError(f"{name} is blocked: this rank has no FSDP2")
        return None

sys.meta_path.insert(0, NoFSDPAdapter())
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from openclaw_ref.sync import harden

after_import = sorted(m for m in sys.modules if m.startswith("torch.distributed.fsdp"))
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
ddp = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
state = harden(ddp)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(3):
    ddp(torch.randn(5, 4)).square().mean().backward()
    opt.step()
    opt.zero_grad()
state.close()
summary = state.summary()
del ddp, state, opt
dist.destroy_process_group()
print(json.dumps({"after_import": after_import, "steps": summary["steps"],
                  "checks": [summary["checks_run"], summary["checks_passed"]],
                  "adapter": sorted(m for m in sys.modules
                                    if m.startswith("openclaw_ref.sync.fsdp"))}))
"""


def test_a_ddp_model_is_hardened_trained_and_closed_without_the_fsdp2_adapter():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", WITHOUT_FSDP_ADAPTER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after_import"] == []  # importing harden loads no FSDP2 of torch's
    assert seen["adapter"] == []
    assert seen["steps"] == 3 and seen["checks"][0] == seen["checks"][1] > 3


def _pin(env: str) -> str:
    """The torch version tox's ``[testenv:ENV]`` installs (its ``torch==X`` dependency)."""
    text = (ROOT / "tox.ini").read_text()
    section = re.search(rf"^\[testenv:{env}\]\n(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    assert section is not None, f"tox.ini has no [testenv:{env}]"
    pins = re.findall(r"torch==([\w.]+)", section.group(1))
    assert len(pins) == 1, f"[testenv:{env}] pins torch {pins}"
    return pins[0]


def test_the_declared_torch_floor_is_the_one_tox_tests():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert floors == [f"torch>={_pin('torch-floor')}"]
    assert project["requires-python"] == ">=3.11"  # enum.StrEnum (sync/base.py) is 3.11+


def test_the_readme_publishes_the_tested_versions():
    text = (ROOT / "README.md").read_text()
    for env in ("torch-floor", "torch-newest"):
        assert f"| {_pin(env)} " in text, f"README's tested matrix lacks torch {_pin(env)}"


def test_fsdp2_before_its_floor_is_refused_naming_the_versions():
    from openclaw_ref.sync.errors import BadInput
    from openclaw_ref.sync.hardening import FSDP2_FLOOR, refuse_old_fsdp2

    floor = ".".join(map(str, FSDP2_FLOOR))
    assert _pin("torch-floor-fsdp2").startswith(f"{floor}.")
    refuse_old_fsdp2(f"{floor}.0")
    refuse_old_fsdp2("2.13.0+cpu")
    with pytest.raises(BadInput, match=rf"FSDP2 from torch {floor} .* this is torch 2\.11\.0"):
        refuse_old_fsdp2("2.11.0+cu128")
