"""The compute canary on CUDA (``pytest -m gpu tests/test_gpu_canary.py``; ``.ci/gpu-canary``
runs it in one call and says what to conclude).

What decides whether the canary may be on by default: on CUDA, with the default
(non-deterministic-allowed) cuDNN/cuBLAS settings, the probe must be bitwise reproducible —
or the start-up self-test must switch it to the tolerance — and a healthy job probing every
step must raise nothing; an SDC fault on one rank must still be named
(``experiments/canary_repro.py``, ``experiments/sdc_corpus.py``). Every test prints one
``GPU-CANARY`` line with its figures (how many probes differed), so the run that executes
them records the numbers. Exactly ONE GPU, two ranks sharing it over gloo with CUDA tensors
(``test_gpu.py``'s ``shared2``: no test here depends on NCCL itself); the pytest parent never
initializes CUDA.
"""

from __future__ import annotations

import json

import pytest
import torch

from openclaw_ref.core.sdc_faults import BACKWARD, BOTH, FORWARD, FaultyMatmul, SDCModel
from openclaw_ref.experiments.canary_repro import (
    FalseAlarmCase,
    ProbeModel,
    false_alarm_task,
    repeat_task,
    stable_or_tolerated,
)
from openclaw_ref.experiments.sdc_corpus import Column, Outcome, SdcCase, corpus_task
from tests import test_gpu as gpu

pytestmark = pytest.mark.gpu
shared2 = gpu.shared2  # the same fixture, one instance per module
REPEATS = 50
K = 2
# a probe every step for this many steps: the false-alarm corpus of one model
FALSE_ALARM_STEPS = {ProbeModel.MLP: 200, ProbeModel.TINY: 100, ProbeModel.SMALL: 50}


def _say(test: str, figures: dict) -> None:
    print(f"GPU-CANARY {test} {json.dumps(figures, sort_keys=True)}")


def injector_flips(ctx) -> dict[str, tuple[int, int]]:
    """Per phase of ``FaultyMatmul``: the bits flipped in element 0 of a matrix product and of
    its weight's gradient on ``ctx.device`` (-1 if any other element changed) — BOTH (1, 1),
    FORWARD (1, 0), BACKWARD (0, 1) on a device whose backward runs on the engine's thread."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 5, generator=g).to(ctx.device)
    w0 = torch.randn(5, 3, generator=g).to(ctx.device)

    def product(mode: FaultyMatmul | None) -> tuple[torch.Tensor, torch.Tensor]:
        w = w0.clone().requires_grad_(True)
        if mode is None:
            out = torch.mm(a, w)
            out.sum().backward()
            return out.detach(), w.grad
        mode.active = True
        with mode:
            out = torch.mm(a, w)
            out.sum().backward()
        return out.detach(), w.grad

    def flipped(x: torch.Tensor, ref: torch.Tensor) -> int:
        if not torch.equal(x.reshape(-1)[1:], ref.reshape(-1)[1:]):
            return -1
        bits = int((x.reshape(-1)[:1].view(torch.int32) ^ ref.reshape(-1)[:1].view(torch.int32))
                   .item())
        return bin(bits & 0xFFFFFFFF).count("1")

    ref_out, ref_grad = product(None)
    out = {}
    for phase in (BOTH, FORWARD, BACKWARD):
        got, grad = product(FaultyMatmul(SDCModel(phase)))
        out[phase] = (flipped(got, ref_out), flipped(grad, ref_grad))
    return out


@gpu.only_one_gpu
@pytest.mark.parametrize("model", list(ProbeModel))
def test_the_probe_is_bitwise_reproducible_over_many_runs_on_cuda(shared2, model):
    """Each rank repeats the probe of rank 0's input; whether the two processes' first digests
    agree is printed too (if not, every job's self-test would switch to the tolerance)."""
    replies = shared2.run(repeat_task, model.value, REPEATS)
    for reply in replies:
        _say("repeat", {**{k: reply[k] for k in (
            "model", "rank", "device", "device_name", "repeats", "differing", "distinct",
            "first_param", "worst_distance", "digest", "torch")},
            "same_across_ranks": len({r["digest"] for r in replies}) == 1})
    for reply in replies:
        assert reply["device"].startswith("cuda")
        assert not reply["deterministic_algorithms"] and not reply["cudnn_deterministic"]
        assert reply["differing"] == 0, (
            f"rank {reply['rank']}: {reply['differing']} of {REPEATS - 1} repeats of the "
            f"{model} probe differed from the first ({reply['distinct']} distinct results, "
            f"first at {reply['first_param']}, at most {reply['worst_distance']:.3g} of a "
            "gradient's mass)")


@gpu.only_one_gpu
@pytest.mark.parametrize("model", list(ProbeModel))
def test_a_healthy_job_probing_every_step_raises_no_false_alarm_on_a_shared_gpu(shared2,
                                                                                model):
    """Two ranks, one GPU: every probe either bitwise stable or switched to the tolerance by
    the confirmation, nothing raised over the whole run, the same story on both ranks."""
    steps = FALSE_ALARM_STEPS[model]
    replies = shared2.run(false_alarm_task, FalseAlarmCase(model.value, steps))
    for r in replies:
        _say("false-alarm", {"model": r["model"], "rank": r["rank"], "error": r["error"],
                             "events": r["events"], "tolerant": r["tolerant"],
                             "probes": r["probes"], "device_name": r["device_name"],
                             "repeats": r["repeats"]})
    for r in replies:
        assert not r["deterministic_algorithms"]
        assert r["probes"] >= steps - 1 and r["steps"] == steps, r
        assert set(r["events"]) <= {"CanaryUnreproducible", "CanaryTransient"}, r["events"]
        assert stable_or_tolerated(r), (
            f"rank {r['rank']}: error {r['error']}; {r['repeats']['differing']} of "
            f"{r['repeats']['repeats'] - 1} repeats differed; tolerant {r['tolerant']}")
    assert len({r["tolerant"] for r in replies}) == 1


@gpu.only_one_gpu
@pytest.mark.parametrize("fault", ["sdc-ulp", "sdc-backward", "sdc-flip-high"])
def test_an_sdc_fault_on_one_rank_sharing_the_gpu_is_named_by_compute_mismatch(shared2,
                                                                               fault):
    case = SdcCase(fault, "1" if fault == "sdc-flip-high" else None, steps=6,
                   canary_every=K)
    rows = [r[0] for r in shared2.run(corpus_task, [case], (Column.ON,))]
    _say("sdc", {"fault": fault, "kind": rows[0]["kind"], "step": rows[0]["step"],
                 "ranks": rows[0]["ranks"], "fired": [r["fired"] for r in rows]})
    for row in rows:
        assert row["outcome"] == Outcome.DETECTED and row["kind"] == "ComputeMismatch", row
        assert row["ranks"] == [0, 1] and row["params"], row  # two ranks: both suspects
        assert row["step"] <= case.fault_step + 2 * K, row
    assert rows[0]["fired"] == 0 and rows[1]["fired"] > 0


@gpu.only_one_gpu
def test_the_sdc_injector_corrupts_cuda_matrix_products_in_the_phase_it_models(shared2):
    flips = shared2.run(injector_flips)
    _say("injector", {"rank0": flips[0]})
    assert flips[0] == flips[1] == {BOTH: (1, 1), FORWARD: (1, 0), BACKWARD: (0, 1)}
