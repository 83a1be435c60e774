"""``harden()`` on a module given to the composable ``replicate()``
(``torch.distributed._composable.replicate``): DDP inside, reached through the module itself.

``replicate(module)`` builds a ``DistributedDataParallel`` over a ``ParameterList`` of the
module's parameters at the module's first forward, and drives it from the module's own forward
hooks (``_pre_forward`` / ``_post_forward``); ``DDP.forward`` is never called. So the step guard
is the same as on a wrapped model, with two differences this module supplies:

- the module the hooks go on is the user's (its forward pre-hook, registered after
  replicate's, sees the reducer armed; its forward hook sees the output), not the DDP object;
- parameter names are the module's own (``replicate``'s ``_param_names``), not the
  ``ParameterList``'s ``0``, ``1``, … — so errors name ``layer.0.weight`` as on a DDP model.

Invariant: nothing here changes what DDP reduces; a replicate'd module whose DDP is not built
yet is built now, exactly as its first forward would (``lazy_init``: the same broadcast from
rank 0 and the same comm-hook registrations), so ``harden()`` works before the first step.
Only the step guard is offered: the per-bucket guard's bypass watch needs ``DDP.forward``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.errors import BadInput


@dataclass(frozen=True)
class Replicated:
    """What ``harden()`` needs of a replicate'd module: its DDP, the module the step guard's
    forward hooks go on, and the parameters by their names in that module."""

    ddp: DDP
    module: nn.Module
    named: list[tuple[str, nn.Parameter]]


def replicate_state(module: nn.Module) -> object | None:
    """``replicate()``'s state on ``module`` (None when replicate was never applied to it, or
    this torch has no composable ``replicate``)."""
    try:
        from torch.distributed._composable.contract import _get_registry
        from torch.distributed._composable.replicate import _ReplicateState, replicate
    except ImportError:
        return None
    if "replicate" not in (_get_registry(module) or {}):
        return None  # asked first: ``replicate.state`` would add an empty registry to ``module``
    state = replicate.state(module)
    return state if isinstance(state, _ReplicateState) else None


def replicated(module: nn.Module) -> Replicated | None:
    """The DDP inside a replicate'd module (built now if its first forward has not run), or
    None when ``module`` was not given to ``replicate()``."""
    state = replicate_state(module)
    if state is None:
        return None
    if not state.has_initialized:
        if state._init_args is None:
            raise BadInput("this module's replicate() state has no DDP and no arguments to build "
                           "one: call harden() on the module replicate() returned")
        state.lazy_init()
    names, params = list(state._param_names), list(state._param_list)
    if len(names) != len(params):
        raise BadInput(f"replicate()'s state names {len(names)} parameters but holds "
                       f"{len(params)}: this torch's replicate() is not the one harden() knows")
    return Replicated(state._ddp, module, list(zip(names, params)))
