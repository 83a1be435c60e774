"""The compute canary under a client we did not write: a real Hugging Face Accelerate loop
(``Accelerator(cpu=True)`` on 2 gloo ranks, ``prepare(model, optimizer, dataloader)``,
``accumulate()``, ``backward()``) hardened after ``prepare``. Training is bitwise the same with
the canary on, off and without ``harden()``, in fp32 and under Accelerate's bf16 autocast (the
probe runs the forward wrapper Accelerate installs); a rank whose matrix unit is faulty is named,
where ``harden()`` without the canary is silent.

Accelerate joins the process group it finds initialised (``PartialState``: it calls
``init_process_group`` only when ``dist.is_initialized()`` is false), so the tasks run on the
session's rank pools; ``_accelerate_env`` gives it the environment it reads and puts the rank's
own back afterwards (its singleton state, ``os.environ`` and the thread count), so the next task
on the pool starts as before. The ``slow`` tests run the same loop under ``accelerate launch``
itself (``tests/accelerate_launched.py``), where Accelerate initialises the group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from openclaw_ref.core.sdc_faults import FaultyMatmul, entered, sdc_model
from openclaw_ref.experiments.sdc_corpus import CLASSES, FEATURES, SdcNet
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden
from tests.helpers import ROOT, free_port

pytest.importorskip("accelerate")

STEPS, ACCUMULATE, BATCH, K = 6, 2, 4, 2  # optimizer steps, micro-batches per step


@dataclass(frozen=True)
class AccelerateRun:
    """One run of the loop: hardened or not, the canary every ``canary_every`` steps (0: off),
    Accelerate's ``mixed_precision``, and ``fault`` (an SDC injector, with ``value``) on rank 1
    from the optimizer step ``fault_step`` on."""

    hardened: bool = True
    canary_every: int = 0
    mixed_precision: str = "no"
    fault: str = ""
    value: str = ""
    fault_step: int = 2


@contextlib.contextmanager
def _accelerate_env(ctx) -> Iterator[None]:
    """The environment Accelerate reads to find this rank in the pool's process group (its
    thread count pinned to the pool's, which it would otherwise reset); then the rank as it was."""
    from accelerate.state import AcceleratorState

    saved, threads = dict(os.environ), torch.get_num_threads()
    os.environ.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size),
                      LOCAL_RANK=str(ctx.local_rank), LOCAL_WORLD_SIZE=str(ctx.local_world_size),
                      MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS=str(threads))
    try:
        yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        os.environ.clear()
        os.environ.update(saved)
        torch.set_num_threads(threads)


def _loader() -> DataLoader:
    """The same dataset on every rank; Accelerate's prepared loader shards it by rank."""
    g = torch.Generator().manual_seed(3)
    n = 2 * STEPS * ACCUMULATE * BATCH
    data = TensorDataset(torch.randn(n, FEATURES, generator=g),
                         torch.randint(0, CLASSES, (n,), generator=g))
    return DataLoader(data, batch_size=BATCH)


def accelerate_task(ctx, run: AccelerateRun) -> dict:
    """The user's Accelerate loop on this rank: its final weights, the error it raised (kind,
    step, ranks, parameters, text), the guard's events, the probes run, the faulty op's count."""
    from accelerate import Accelerator

    with _accelerate_env(ctx):
        acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE,
                          mixed_precision=run.mixed_precision)
        assert (acc.num_processes, acc.process_index) == (ctx.world_size, ctx.rank)
        return train_under(acc, run, ctx)


def train_under(acc, run: AccelerateRun, ctx=None) -> dict:
    """The loop under ``acc`` (``ctx``: the launcher's rank context for ``harden``, or None
    under ``accelerate launch``): what ``accelerate_task`` returns."""
    rank = acc.process_index
    torch.manual_seed(0)
    model = SdcNet()
    model, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                     _loader())
    state = (harden(model, SyncConfig(canary_every=run.canary_every), ctx)
             if run.hardened else None)
    mode = FaultyMatmul(sdc_model(run.fault, run.value)) if run.fault and rank == 1 else None
    error = None
    torch.manual_seed(1 + rank)  # the dropout streams: rank-dependent, as in a real job
    try:
        with entered(mode):
            for i, (x, y) in enumerate(loader):
                if mode is not None:
                    mode.active = i // ACCUMULATE >= run.fault_step
                with acc.accumulate(model):
                    acc.backward(F.cross_entropy(model(x), y))
                    opt.step()
                    opt.zero_grad()
    except ConsistencyError as exc:
        error = {"kind": exc.kind, "step": exc.step, "ranks": list(exc.ranks),
                 "params": list(exc.params), "text": str(exc)}
    events = [(e.kind, list(e.ranks)) for e in state.events] if state is not None else []
    probes = state.canary.probes if state is not None and state.canary is not None else 0
    if state is not None:
        state.close(verify=error is None)
    return {"error": error, "events": events, "probes": probes,
            "fired": mode.fired if mode is not None else 0,
            "weights": [p.detach().clone() for p in model.parameters()]}


def _same_weights(a: dict, b: dict) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a["weights"], b["weights"], strict=True))


def _quiet(reply: dict) -> None:
    assert reply["error"] is None and reply["events"] == [], (reply["error"], reply["events"])


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_an_accelerate_loop_trains_bitwise_the_same_with_the_canary_on_off_and_unhardened(
        pools, precision):
    """With accumulation (a probe may run in a ``no_sync`` micro-step) and, under bf16,
    through the autocast wrapper Accelerate puts on the model's forward."""
    pool = pools.get(2)
    bare, off, on = (pool.run(accelerate_task, AccelerateRun(hardened, every, precision))
                     for hardened, every in ((False, 0), (True, 0), (True, 1)))
    for a, b, c in zip(bare, off, on):
        _quiet(b)
        _quiet(c)
        assert c["probes"] >= STEPS - 1  # the canary really probed, at (almost) every step
        assert _same_weights(a, b) and _same_weights(b, c)
    assert _same_weights(on[0], on[1])


# a 1-ulp error in every backward product; an exponent flip in every one (``sdc_faults``)
FAULTS = [AccelerateRun(fault="sdc-backward"), AccelerateRun(fault="sdc-flip-high", value="1")]
# without the canary: the same 1-ulp error; an exponent flip in a tenth of the backward products
# from step 4 (1 flip here: more would drive the weights to inf, which the guard reports as a
# skipped non-finite step, naming no rank)
SILENT = [FAULTS[0], AccelerateRun(fault="sdc-flip-high", value="0.1", fault_step=4)]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda r: r.fault)
def test_the_canary_names_a_faulty_backward_on_rank_1_within_2k_steps_under_accelerate(
        pools, fault):
    fault = dataclasses.replace(fault, canary_every=K)
    replies = pools.get(2).run(accelerate_task, fault)
    assert replies[0]["fired"] == 0 and replies[1]["fired"] > 0
    for reply in replies:
        err = reply["error"]
        assert err is not None and err["kind"] == "ComputeMismatch", reply
        assert err["ranks"] == [0, 1] and err["params"]  # two ranks: both suspects
        assert fault.fault_step < err["step"] <= fault.fault_step + 2 * K
        assert "either side may be the faulty one" in err["text"] and reply["events"] == []
    assert replies[0]["error"] == replies[1]["error"]  # every rank tells the same story


@pytest.mark.parametrize("fault", SILENT, ids=lambda r: r.fault)
def test_harden_without_the_canary_is_silent_on_those_faults_under_accelerate(pools, fault):
    replies = pools.get(2).run(accelerate_task, fault)
    assert replies[1]["fired"] > 0
    for reply in replies:
        _quiet(reply)


def test_an_exponent_flip_under_harden_without_the_canary_moves_the_weights_unreported(pools):
    pool = pools.get(2)
    clean, faulty = pool.run(accelerate_task, AccelerateRun()), pool.run(accelerate_task,
                                                                         SILENT[1])
    for a, b in zip(clean, faulty):
        _quiet(b)
        assert not _same_weights(a, b)


def _launched(tmp_path: Path, *args: str, timeout_s: float = 150) -> list[dict]:
    """Each rank's reply from ``accelerate launch`` of ``tests/accelerate_launched.py`` on 2
    CPU ranks (loopback rendezvous, 1 thread each); ``args``: the script's options."""
    out = tmp_path / "ranks"
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", "2", "--num_machines", "1", "--main_process_ip", "127.0.0.1",
               "--main_process_port", str(free_port()), "--mixed_precision", "no",
               "--dynamo_backend", "no", "-m", "tests.accelerate_launched", "--out", str(out),
               *args]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's ranks live in its session
        proc.wait()
    assert proc.returncode == 0, log[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


# ~12 s per launch here: the slow profile
@pytest.mark.slow
def test_under_accelerate_launch_the_canary_on_and_off_train_bitwise_the_same(tmp_path):
    off = _launched(tmp_path / "off")
    on = _launched(tmp_path / "on", "--canary-every", "1")
    for a, b in zip(off, on):
        assert b["world_size"] == 2 and b["error"] is None and b["events"] == []
        assert b["probes"] >= STEPS - 1 and a["weights"] == b["weights"]


@pytest.mark.slow
def test_under_accelerate_launch_a_faulty_rank_is_named_on_every_rank(tmp_path):
    replies = _launched(tmp_path, "--canary-every", str(K), "--fault", "sdc-backward")
    assert replies[1]["fired"] > 0
    for reply in replies:
        assert reply["error"]["kind"] == "ComputeMismatch" and reply["error"]["ranks"] == [0, 1]
    assert replies[0]["error"] == replies[1]["error"]
