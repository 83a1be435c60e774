"""The canary as a user meets it: a plain torchrun script with ``harden(ddp)`` and nothing else
(``tests/canary_user_script.py``). Honest non-determinism on every rank trains on; a rank whose
matmuls compute wrong from the start is named at the first probe — the outlier at three
ranks, both suspects at two."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT, free_port


def _torchrun(tmp_path, world: int, *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(world), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "tests.canary_user_script", "--out", str(tmp_path), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "GLOO_SOCKET_IFNAME": "lo"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def test_a_plain_script_with_noise_on_every_rank_trains_on_under_the_defaults(tmp_path):
    for reply in _torchrun(tmp_path, 2, "--noise", "1"):
        assert reply["error"] is None, reply
        assert reply["canary"]["mode"] == "tolerance" and reply["canary"]["probes"] == 1


def test_a_plain_script_names_the_faulty_rank_of_three_at_the_first_probe(tmp_path):
    replies = _torchrun(tmp_path, 3, "--fault", "sdc-ulp", "--fault-rank", "2")
    for reply in replies:
        assert (reply["error"], reply["ranks"], reply["step"]) == ("ComputeMismatch", [2], 1)
        assert "drain the named node" in reply["message"]


def test_a_plain_script_of_two_ranks_names_both_suspects(tmp_path):
    for reply in _torchrun(tmp_path, 2, "--fault", "sdc-ulp", "--fault-rank", "0"):
        assert (reply["error"], reply["ranks"], reply["step"]) == ("ComputeMismatch", [0, 1], 1)
        assert "either side may be the faulty one" in reply["message"]
