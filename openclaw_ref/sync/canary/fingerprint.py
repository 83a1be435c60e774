"""What decides the bits of a rank's probe, exchanged once before the first probe: the compute
canary compares bitwise only where that can hold.

Two ranks give bitwise equal results for the same computation only with the same library
builds, the same device model and slice (cuBLAS picks its kernels by the SM count: a MIG slice
differs from a whole GPU), the same numeric flags (TF32, reduced-precision reductions,
deterministic algorithms), the same CPU kernels (the ISA torch dispatches to) and the same
thread count (a CPU reduction is split per thread), and with algorithm choices that are not
timed per process (``cudnn.benchmark``). Anything else — pytorch #137418, #150725, #147966,
#163369 — makes an honest, healthy job differ in the last bits, which a bitwise canary would
call corruption. So before the first probe every rank sends these fields as text (fixed-size
bytes in one tensor all-gather — never a pickle); where any differs, or where
``cudnn.benchmark`` is on for a CUDA model, the canary starts on its tolerance and says which
rank differs in what (``vote.majority``: with two ranks, both).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import torch
from torch import nn

from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.vote import majority, split_view

FIELD_BYTES = 48  # each field's text, utf-8, cut to this many bytes


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device(device: torch.device) -> str:
    if device.type != "cuda":
        return _cpu_model()
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} sm{props.major}{props.minor} x{props.multi_processor_count}"


def _compiled(module: nn.Module) -> str:
    return "compiled" if isinstance(getattr(module, "_orig_mod", None), nn.Module) else "eager"


def _flags() -> str:
    cuda = torch.backends.cuda.matmul
    return (f"tf32 {int(cuda.allow_tf32)}{int(torch.backends.cudnn.allow_tf32)} "
            f"{torch.get_float32_matmul_precision()} "
            f"reduced {int(cuda.allow_bf16_reduced_precision_reduction)}"
            f"{int(cuda.allow_fp16_reduced_precision_reduction)} "
            f"det {int(torch.are_deterministic_algorithms_enabled())}")


FIELDS: dict[str, Callable[[torch.device, nn.Module], str]] = {
    "torch": lambda d, m: torch.__version__,
    "CUDA/cuDNN": lambda d, m: f"{torch.version.cuda} {torch.backends.cudnn.version()}"
    if d.type == "cuda" else "-",
    "device": lambda d, m: _device(d),
    "CPU kernels": lambda d, m: torch.backends.cpu.get_cpu_capability(),
    "threads": lambda d, m: str(torch.get_num_threads()),
    "numeric flags": lambda d, m: _flags(),
    "cudnn.benchmark": lambda d, m: str(int(torch.backends.cudnn.benchmark))
    if d.type == "cuda" else "-",
    "compile": lambda d, m: _compiled(m),
}


def local_fingerprint(device: torch.device, module: nn.Module) -> list[str]:
    """This rank's fields, in ``FIELDS`` order."""
    return [read(device, module) for read in FIELDS.values()]


def encode_fields(fields: list[str]) -> torch.Tensor:
    out = torch.zeros(len(fields) * FIELD_BYTES, dtype=torch.uint8)
    for j, text in enumerate(fields):
        raw = text.encode("utf-8")[:FIELD_BYTES]
        out[j * FIELD_BYTES:j * FIELD_BYTES + len(raw)] = torch.frombuffer(bytearray(raw),
                                                                            dtype=torch.uint8)
    return out


def decode_fields(row: list[int]) -> list[str]:
    return [bytes(row[j:j + FIELD_BYTES]).rstrip(b"\0").decode("utf-8", "replace")
            for j in range(0, len(row), FIELD_BYTES)]


def exchange(fields: list[str], group, device: torch.device) -> list[list[str]]:
    """Every rank's fields, in rank order (one tensor all-gather of bytes)."""
    local = encode_fields(fields).to(checks.collective_device(group, device))
    return [decode_fields(row) for row in checks.gather_rows(local, group).tolist()]


def unequal(table: list[list[str]], on_cuda: bool) -> tuple[list[int], str] | None:
    """Why the ranks of ``table`` cannot be compared bitwise — the suspect ranks and the
    words — or None when they can."""
    names = list(FIELDS)
    suspects: set[int] = set()
    words = []
    for j, name in enumerate(names):
        values = [row[j] for row in table]
        vote = majority(values)
        if vote.differing:
            suspects.update(vote.differing)
            words.append(f"{name}: {split_view(values, vote)}")
    if on_cuda and any(row[names.index('cudnn.benchmark')] == "1" for row in table):
        words.append("cudnn.benchmark is on: each process times its own convolution "
                     "algorithms, so equal ranks may still compute other bits")
    if not words:
        return None
    return sorted(suspects), "; ".join(words)
