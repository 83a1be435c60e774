"""Where ranks run when a machine has fewer GPUs than ranks — decided on the CPU.

``--backend nccl`` on one GPU: a lone rank uses NCCL; two or more ranks use gloo with CUDA
tensors on the shared GPU (NCCL refuses two ranks on one device), and the results go to
``results/<n>x<gpu>-nccl``; Lightning's two devices then train on the CPU, so in bf16. Without
any GPU the request fails at once with exit 2 and one line.
The GPU count is faked here (``torch.cuda`` patched in the parent only: nothing is spawned).
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from openclaw_ref.cli import main
from openclaw_ref.core.launch import on_cuda, resolve_backend
from openclaw_ref.experiments.compare import placements
from openclaw_ref.experiments.settings import machine_tag
from openclaw_ref.sync.errors import BadInput


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has ``n`` GPUs named "NVIDIA H200"."""
    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    return fake


def test_nccl_on_one_gpu_runs_one_rank_on_nccl(gpus):
    gpus(1)
    assert resolve_backend("nccl", 1) == "nccl" and on_cuda("nccl", 1)


def test_nccl_on_one_gpu_runs_two_ranks_as_gloo_with_cuda_tensors(gpus):
    gpus(1)
    assert resolve_backend("nccl", 2) == "gloo" and on_cuda("nccl", 2)


def test_auto_on_one_gpu_keeps_two_ranks_on_the_cpu(gpus):
    gpus(1)
    assert resolve_backend("auto", 2) == "gloo" and not on_cuda("auto", 2)


def test_gloo_never_moves_tensors_to_a_gpu(gpus):
    gpus(8)
    assert not on_cuda("gloo", 2)


def test_nccl_without_a_gpu_is_refused_with_a_reason(gpus):
    gpus(0)
    with pytest.raises(BadInput, match="needs CUDA GPUs; this machine has none"):
        resolve_backend("nccl", 1)


def test_compare_on_one_gpu_writes_under_the_gpu_machine_tag(gpus):
    gpus(1)
    assert machine_tag("nccl", 4) == "1xH200-nccl"


def test_compare_records_each_world_sizes_backend_and_device(gpus):
    gpus(1)
    assert placements("nccl", (2, 4)) == [
        {"world_size": 1, "backend": "nccl", "device": "cuda"},
        {"world_size": 2, "backend": "gloo", "device": "cuda"},
        {"world_size": 4, "backend": "gloo", "device": "cuda"}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_compare_with_nccl_and_no_gpu_exits_2_with_one_line_before_spawning(tmp_path, capsys):
    children = set(multiprocessing.active_children())
    code = main(["compare", "--backend", "nccl", "--out-root", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "backend nccl needs CUDA GPUs" in err[0]
    assert set(multiprocessing.active_children()) == children
    assert list(tmp_path.iterdir()) == []


def test_lightning_on_one_gpu_with_two_devices_trains_on_the_cpu_in_bf16(gpus, tmp_path):
    from openclaw_ref.experiments.sections.lightning import lightning_command
    from openclaw_ref.experiments.settings import CompareConfig

    gpus(1)
    cmd = lightning_command(CompareConfig(lightning_devices=2), tmp_path / "out.json")
    assert cmd[cmd.index("--precision") + 1] == "bf16-mixed"  # fp16 AMP refuses the CPU


def test_lightning_with_a_gpu_per_device_uses_fp16(gpus, tmp_path):
    from openclaw_ref.experiments.sections.lightning import lightning_command
    from openclaw_ref.experiments.settings import CompareConfig

    gpus(2)
    cmd = lightning_command(CompareConfig(lightning_devices=2), tmp_path / "out.json")
    assert cmd[cmd.index("--precision") + 1] == "16-mixed"
