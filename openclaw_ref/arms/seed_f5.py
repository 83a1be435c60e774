"""``seed-f5``: the seed's F5 hook exactly as written (seed 000 §4.2), on stock DDP.

The seed's ``OpenCLAWDDPHook._pre_allreduce_hook`` is registered, *before* DDP wraps the model,
as a **forward** hook on every module whose name contains ``sparse`` or ``gating``. Each call:

  1. synchronizes the device (``torch.cuda.synchronize()``; on CPU there is no stream to wait
     for, so it is a no-op here);
  2. for every parameter with a gradient: ``param.grad.data = param.grad.data.half() * 2**12``
     — never divided back (the ``grad /= 2^12`` box of the seed's flowchart has no code);
  3. builds ``shapes = [p.grad.shape or None for p in model.parameters()]`` — the list of *this
     rank's own* parameters — and, on rank 0 only, asserts every entry equals the first one.

Nothing in it talks to another rank, so step 3 compares different parameters of one rank,
never one parameter across ranks. Name matching: our modules are named by attribute
(``layer.3.ffn``, ``layer.3.ffn.gate``); the seed's test is applied to the qualified name and
the class name (``SparseFFN``, ``SparseGatingUnit``), which is how the seed's model names them.

The F2 half of the seed's class (``_dynamic_bucketing``) is measured by ``bucketed
norm-ema``; it is not part of this strategy. What the hook did is counted (calls, gradients it
rescaled, assertions it evaluated over present gradients) in ``summary()``.

This module does not import the launcher or the training loop: ``wrap`` takes any ``ctx`` with
``device`` (the rank's torch device).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.arms.ddp import wrap_ddp
from openclaw_ref.arms.strategy import SyncStrategy

SEED_SCALE = 2 ** 12  # the seed's "FP16 normalization prefix"
SEED_NAME_KEYS = ("sparse", "gating")  # the seed's module filter


def seed_selects(name: str, module: nn.Module) -> bool:
    """The seed's ``'sparse' in name or 'gating' in name``, over the qualified and class name."""
    key = f"{name} {type(module).__name__}".lower()
    return any(k in key for k in SEED_NAME_KEYS)


class SeedF5Hook:
    """The seed's ``OpenCLAWDDPHook`` minus the bucketing method, with counters."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.calls = 0
        self.rescaled = 0  # gradients multiplied by 2^12 (and cast to fp16)
        self.asserted_present = 0  # assertions evaluated over at least one present gradient

    def _pre_allreduce_hook(self, module: nn.Module, input: Any, output: Any) -> None:
        self.calls += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # checkpoint 1: the seed's synchronize
        for _, param in self.model.named_parameters():
            if param.grad is not None:
                # checkpoint 2, as written: fp16 "normalization" prefix, never undone
                param.grad.data = param.grad.data.half() * SEED_SCALE
                self.rescaled += 1
        shapes = [p.grad.shape if p.grad is not None else None for p in self.model.parameters()]
        if any(s is not None for s in shapes):
            self.asserted_present += 1
        if dist.get_rank() == 0:
            assert all(s == shapes[0] for s in shapes), (
                f"Shape mismatch in openclaw model: {shapes}")


def register_seed_hook(model: nn.Module, device: torch.device) -> tuple[SeedF5Hook, list]:
    """Register the hook on every module the seed's filter selects (call before wrapping)."""
    hook = SeedF5Hook(model, device)
    handles = [module.register_forward_hook(hook._pre_allreduce_hook)
               for name, module in model.named_modules() if seed_selects(name, module)]
    return hook, handles


class SeedF5(SyncStrategy):
    """``seed-f5``: stock DDP (fp32 allreduce, ``find_unused_parameters``) with the seed's F5
    forward hook registered before wrapping. Never skips a step, never raises an event of its
    own: whatever it catches surfaces as the assertion's ``AssertionError`` on rank 0."""

    name = "seed-f5"

    def wrap(self, model: nn.Module, ctx: Any) -> nn.Module:
        self.hook, self._handles = register_seed_hook(model, ctx.device)
        self.hooked = len(self._handles)
        self.ddp = wrap_ddp(model, ctx, self.cfg)
        return self.ddp

    def summary(self) -> dict:
        h = getattr(self, "hook", None)
        return {"hooked_modules": getattr(self, "hooked", 0),
                "hook_calls": h.calls if h else 0,
                "grads_rescaled": h.rescaled if h else 0,
                "assertions_over_present_grads": h.asserted_present if h else 0}

    def close(self, verify: bool = True) -> None:
        for handle in getattr(self, "_handles", []):
            handle.remove()
        self._handles = []
