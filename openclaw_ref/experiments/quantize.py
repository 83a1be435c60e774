"""Int8 quantization of a trained openclaw model on CPU (seed 004's L4 deployment step).

The seed writes ``quantize_fx(model, qconfig_spec={'': get_default_qconfig('fbgemm')})``.
FX graph mode needs a symbolically traceable model; ours is not (attention builds its mask
from the traced sequence length, experts are chosen by data-dependent control flow), so the
FX attempt is made, and its error recorded, and the model is then quantized the way that
does work here: dynamic int8 quantization of every ``nn.Linear`` (weights int8 per tensor,
activations quantized on the fly) with the fbgemm engine (x86 where fbgemm is absent).

``measure(model, batch)`` returns the fields the ledger reads (``backend``, ``accuracy_fp32``,
``accuracy_int8``, ``latency_fp32_ms``, ``latency_int8_ms``), or ``{"error": ...}`` when no
int8 path runs on this build.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from typing import Any

import torch
from torch import nn

ENGINES = ("fbgemm", "x86")  # the seed's engine first; x86 is its successor on newer builds


def pick_engine() -> str | None:
    supported = torch.backends.quantized.supported_engines
    return next((e for e in ENGINES if e in supported), None)


def _forward(model: nn.Module, batch: Any, step: int) -> torch.Tensor:
    with torch.no_grad():
        return model(batch.tokens, batch.sample_ids, step)


def try_fx(model: nn.Module, batch: Any, engine: str,
           step: int) -> tuple[nn.Module | None, str | None]:
    """The seed's FX graph-mode path: prepare, calibrate on ``batch``, convert, run once.
    Returns (the int8 model, None), or (None, the error) where any stage fails."""
    try:
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping(engine),
                                  example_inputs=(batch.tokens, batch.sample_ids, step))
            _forward(prepared, batch, step)  # calibration
            qmodel = convert_fx(prepared)
            _forward(qmodel, batch, step)
    except Exception as exc:  # noqa: BLE001 - any failure is the finding: recorded, not raised
        return None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return qmodel, None


def quantize_dynamic_linear(model: nn.Module, engine: str) -> nn.Module:
    """A copy of ``model`` with every ``nn.Linear`` replaced by a dynamic int8 one."""
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear},
                                                      dtype=torch.qint8)


def latency_ms(model: nn.Module, batch: Any, step: int, repeats: int = 20,
               warmup: int = 3) -> float:
    """Median wall time of one forward over ``batch`` on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(warmup):
            _forward(model, batch, step)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _forward(model, batch, step)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def accuracy(model: nn.Module, batch: Any, step: int) -> float:
    return float((_forward(model, batch, step).argmax(-1) == batch.labels).float().mean())


def measure(model: nn.Module, batch: Any, step: int, repeats: int = 20) -> dict:
    """fp32 vs int8 accuracy and latency of ``model`` on ``batch`` (tokens, sample_ids,
    labels), evaluated at ``step`` (the model's evaluation sparsity)."""
    engine = pick_engine()
    if engine is None:
        return {"error": "no fbgemm/x86 quantized engine in this torch build "
                         f"(supported: {torch.backends.quantized.supported_engines})"}
    model = model.to("cpu").eval()
    qmodel, fx_error = try_fx(model, batch, engine, step)
    try:
        if qmodel is None:
            qmodel = quantize_dynamic_linear(model, engine)
        acc_q = accuracy(qmodel, batch, step)
    except Exception as exc:  # noqa: BLE001 - recorded: the ledger says int8 did not run here
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "backend": engine,
                "fx_error": fx_error}
    acc = accuracy(model, batch, step)
    agree = float((_forward(model, batch, step).argmax(-1)
                   == _forward(qmodel, batch, step).argmax(-1)).float().mean())
    linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    return {
        "backend": engine,
        "method": "dynamic int8 (torch.ao.quantization.quantize_dynamic, nn.Linear → qint8)"
                  if fx_error else "fx (prepare_fx, calibrate, convert_fx)",
        "fx_error": fx_error,
        "linear_layers": linear,
        "samples": int(batch.labels.numel()),
        "accuracy_fp32": acc,
        "accuracy_int8": acc_q,
        "accuracy_delta": acc_q - acc,
        "prediction_agreement": agree,
        "latency_fp32_ms": latency_ms(model, batch, step, repeats),
        "latency_int8_ms": latency_ms(qmodel, batch, step, repeats),
        "latency_repeats": repeats,
        "threads": 1,
    }
