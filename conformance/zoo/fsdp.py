"""The suite's own FSDP2 target and subjects, for ``--openclaw-wrapper fsdp2``/``hsdp``: a
subject is ``CALLABLE(fsdp_model, mesh)``, called after the last ``fully_shard``, and what it
returns is closed after the run.

  ``mlp``                   FACTORY(): a 3-block MLP with LayerNorm and rank-dependent inputs
                            (each block a ``fully_shard`` unit);
  ``hardened``              ``harden()`` with its defaults (the default subject);
  ``hardened_but_doubles``  broken: ``harden()``, then every reduced gradient doubled (a
                            post-accumulate-grad hook, as a wrong unscaling would) — the sum of
                            the ranks' gradients instead of their average; equivalence with
                            stock FSDP2 must fail on every rank. (Setting the gradient divide
                            factor to 1 would be the natural mistake, but FSDP2 then reduces
                            with ``PREMUL_SUM``, which gloo refuses.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from openclaw_ref.conformance.target import Batch, Target

PER_RANK = 8


def mlp() -> Target:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.Sequential(nn.LayerNorm(32), nn.Tanh()),
                          nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = torch.Generator().manual_seed(10_007 * step + 101 * rank + 1)
        x = torch.randn(PER_RANK, 12, generator=g) * (1 + rank)  # averaging matters
        return x, torch.randint(0, 3, (PER_RANK,), generator=g)

    return Target(model, batch, F.cross_entropy, lr=0.1)


def hardened(fsdp_model, mesh):
    from openclaw_ref.sync.hardening import harden

    return harden(fsdp_model)


def hardened_but_doubles(fsdp_model, mesh):
    guard = hardened(fsdp_model, mesh)
    for p in fsdp_model.parameters():
        p.register_post_accumulate_grad_hook(_double)
    return guard


def _double(p: torch.Tensor) -> None:
    p.grad.mul_(2.0)
