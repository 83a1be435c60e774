"""What ``harden()`` sets on a DDP model for the step guard besides the guard itself: the wire
refused or registered before any hook (the step guard has no Python comm hook, so it can send
only what DDP's C++ path sends), the handle that undoes an attribute it set, the join hook of a
joined rank, the two engine helpers the guard's step uses (a CUDA timing mark, a callback at
the end of the backward's graph task), and what a rank whose DDP did not reduce every bucket
sends: zeros for the buckets it never issued, and why (``why_unissued``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig, Wire
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.averaged import _accumulator
from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.control_layout import NotIssued
from openclaw_ref.sync.evidence.precision import ScalePolicy


def refuse_unsupported(cfg: SyncConfig) -> None:
    """What the step guard cannot do without a Python comm hook, refused before anything is
    registered: a bf16 wire (DDP has no built-in bf16 hook) and an fp16 pre-scale."""
    if cfg.wire is Wire.BF16:
        raise BadInput("a bf16 wire needs the per-bucket guard: DDP has no built-in bf16 comm "
                       "hook; pass SyncConfig(guard='bucket') (--guard bucket)")
    if ScalePolicy.from_config(cfg).pre_scales:
        raise BadInput(f"an fp16 pre-scale (--scale {cfg.scale}) needs the per-bucket guard; "
                       "pass SyncConfig(guard='bucket') (--guard bucket), or keep the default "
                       "--scale loss-scaler")


def register_wire(ddp_model: DDP, cfg: SyncConfig) -> None:
    """The gradients' wire on DDP's own C++ path: none for native/fp32, DDP's built-in
    ``FP16_COMPRESS`` (cast, ÷W, SUM, copy back: PyTorch's ``fp16_compress_hook``) for fp16."""
    if cfg.wire is Wire.FP16:
        ddp_model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)



class JoinedExchange:
    """DDP's join hook, then the joined rank's slot of each step the others still run."""

    def __init__(self, hook, guard) -> None:
        self.hook, self.guard = hook, guard

    def main_hook(self) -> None:
        self.hook.main_hook()
        if not self.guard.closed:
            self.guard.joined_exchange()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.hook.post_hook(is_last_joiner)


def exchange_layout(world_size: int) -> CountLayout:
    """The layout of the step guard's one exchange per step: the counts of one row (B = 1:
    the whole step is one "bucket" to the counts) and the replica row, in fp32 whatever the
    gradients' wire, so the counts stay exact up to 2^24 ranks per group."""
    return CountLayout(world_size, torch.float32)


def exchange_block(world_size: int, device: torch.device) -> torch.Tensor:
    """A zeroed buffer of the step guard's per-step exchange (``exchange_layout``) on
    ``device``: what the guard sends every step, and what the hook-cost job's ``floor`` arm
    sends bare."""
    layout = exchange_layout(world_size)
    return torch.zeros(layout.size(1), dtype=layout.dtype, device=device)


def cuda_mark():
    """A timing event recorded now on the current CUDA stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def queue_callback(callback) -> None:
    """Run ``callback`` when the current autograd graph task ends."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)



def send_used_map(ddp: DDP, group: dist.ProcessGroup) -> None:
    """Under ``find_unused_parameters`` (a dynamic graph) DDP allreduces its map of the
    parameters this backward used once it has issued its last bucket. A rank whose DDP did not
    issue every bucket (a forward through ``ddp.module``, parameters replaced) sends zeros of
    that map after its zero buckets, so that the other ranks' map allreduce completes too
    (gloo aborts on a collective left unpaired or paired with another size)."""
    if ddp.find_unused_parameters and not getattr(ddp, "static_graph", False):
        dist.all_reduce(torch.zeros_like(ddp.reducer._get_local_used_map()), group=group)


def send_unissued(ddp: DDP, prepared: bool, present: dict[int, bool], wire: Wire,
                  group: dist.ProcessGroup) -> int:
    """Zeros, in DDP's wire format, for every bucket this rank's DDP did not issue this
    backward, so that the other ranks' allreduces complete (DDP issues its buckets in index
    order, each once all its members are ready, so the issued ones are a prefix); returns the
    first such bucket's index. ``present``: id(parameter) → got a gradient, for the parameters
    the guard tracks; ``prepared``: DDP's own forward prepared the reducer."""
    first = None
    issued = prepared
    for bucket in ddp.reducer._get_zeros_like_grad_buckets():
        issued = issued and all(present[id(p)] for p in bucket.parameters() if id(p) in present)
        if issued:
            continue
        first = bucket.index() if first is None else first
        buffer = bucket.buffer()
        if wire is Wire.FP16:
            buffer = buffer.to(torch.float16)
        dist.all_reduce(buffer, group=group)
    if first is None:
        return 0
    send_used_map(ddp, group)
    return first


def why_unissued(module: nn.Module, tracked: list[tuple[str, nn.Parameter]], accumulators: list,
                 present: bytearray, prepared: bool) -> tuple[NotIssued, int | None]:
    """Why this rank's DDP did not reduce every bucket of a backward, and the index in
    ``tracked`` of the first parameter concerned (None: not one in particular) — the evidence
    only this rank holds, which its slot carries so that every rank words the verdict alike
    (``control.not_reduced``): no forward of DDP's own prepared the reducer (the whole
    forward is concerned); parameters replaced after wrapping (another Parameter object under
    the name, or another gradient accumulator than the one DDP hooked, after a dtype/device
    conversion: the first replaced); else DDP waited for a parameter without a gradient (the
    first such). ``accumulators``: the nodes DDP hooked, as ``tracked``; ``present``: 1 where
    the parameter got a gradient through it."""
    if not prepared:  # the whole forward: every parameter's gradient is concerned
        return NotIssued.BYPASSED, None
    current = dict(module.named_parameters())
    replaced = next((i for i, ((n, p), node) in enumerate(zip(tracked, accumulators))
                     if current.get(n) is not p or _accumulator(p) is not node), None)
    if replaced is not None:
        return NotIssued.REPLACED, replaced
    return NotIssued.STOPPED, next((i for i, seen in enumerate(present) if not seen), None)
