"""What a guard attaches to modules the user owns, and the rule that none of it travels with
them: a hardened model pickles, ``torch.save``s and deep-copies as a stock one does, and the
copy is the plain model it was before ``harden()``.

A guard rides on the user's modules: its mark (``target.HARDENED_MARK``), DDP's join hook and
the comm-hook refusal on the DDP object, forward hooks on the DDP object and on the module DDP
runs, the per-bucket guard's comm hook in DDP's list. Each holds the guard, and through it a
process group, a watchdog thread and locks, none of which pickle — DDP's own ``__getstate__``
drops only its process group, reducer and logger. So while a guard holds a module, the module
carries an instance ``__getstate__`` (``Stripped``: pickle, ``copy`` and ``torch.save`` ask the
instance before its class) that returns the class's own state less every entry the guard's
handles name: an attribute it set (``Unset``), a hook it registered (torch's
``RemovableHandle``: its dictionaries and id), an item it appended to a list (``Appended``).

Invariants: nothing global (the filter lives on the module, reads the guard's own handle list,
and goes at ``close()``); the live module is never changed by a pickle (the filter edits
copies of the state and of the hook dictionaries it names); the copy holds nothing of the
guard, so it is not hardened and knows it — ``harden()`` it again after loading.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

STATE = "__getstate__"
Hook = TypeVar("Hook", bound=Callable)


def eager(hook: Hook) -> Hook:
    """``hook``, to be registered on a user's module, run eagerly where dynamo compiles the
    module's call: a compiled DDP (``torch.compile(ddp)``) traces its module's hooks, and the
    guard's bookkeeping — host clocks, autograd-node hooks, the canary's probe — is no graph:
    traced, each host call breaks the graph inside the hook, and the probe (which sets dynamo's
    stance itself) fails. In eager mode a thin wrapper (~1 µs a call, timed by hand here)."""
    return torch.compiler.disable(hook)


MISSING = object()  # no instance attribute of that name before ``harden()`` set one


class Unset:
    """A removable handle for an instance attribute ``harden()`` set: ``remove()`` puts back
    the instance's own value from before (``previous``; a framework's wrapper, e.g. the
    conformance suite's recording ``register_comm_hook``), else deletes it, so the class's
    attribute shows through again."""

    def __init__(self, obj: object, name: str, previous: object = MISSING) -> None:
        self.obj, self.name, self.previous = obj, name, previous

    def remove(self) -> None:
        if self.previous is MISSING:
            self.obj.__dict__.pop(self.name, None)
        else:
            self.obj.__dict__[self.name] = self.previous


class Appended:
    """A removable handle for ``item``, appended by ``harden()`` to the list ``obj.<name>``
    (the per-bucket guard's entry in DDP's ``_comm_hooks``)."""

    def __init__(self, obj: object, name: str, item: object) -> None:
        self.obj, self.name, self.item = obj, name, item

    def remove(self) -> None:
        items = self.obj.__dict__.get(self.name)
        if items is not None:
            items[:] = [x for x in items if x is not self.item]


def _dropped_ids(handles: Iterable[object]) -> dict[int, set[int]]:
    """id(hook dictionary) → the hook ids the handles registered in it."""
    dropped: dict[int, set[int]] = {}
    for h in handles:
        if isinstance(h, RemovableHandle):
            for ref in (h.hooks_dict_ref, *h.extra_dict_ref):
                d = ref()
                if d is not None:
                    dropped.setdefault(id(d), set()).add(h.id)
    return dropped


def without(state: dict, module: object, handles: list[object]) -> dict:
    """A copy of ``module``'s pickled ``state`` less what ``handles`` added to it."""
    state = dict(state)
    dropped = _dropped_ids(handles)
    for key, value in state.items():
        ids = dropped.get(id(value)) if isinstance(value, dict) else None
        if ids:
            state[key] = type(value)((k, v) for k, v in value.items() if k not in ids)
    for h in handles:
        if isinstance(h, Unset) and h.obj is module:
            if h.previous is MISSING:
                state.pop(h.name, None)
            else:
                state[h.name] = h.previous
        elif isinstance(h, Appended) and h.obj is module and h.name in state:
            state[h.name] = [x for x in state[h.name] if x is not h.item]
    return state


class Stripped:
    """The instance ``__getstate__`` of a module one or more guards hold (module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = weakref.ref(module)
        self.sources: list[list[object]] = []  # each holding guard's handle list
        self.previous = module.__dict__.get(STATE)  # an instance __getstate__ already there

    def __call__(self) -> object:
        module = self.module()
        state = (self.previous() if self.previous is not None
                 else type(module).__getstate__(module))
        if not isinstance(state, dict):  # a class of the user's own making: as it says
            return state
        for handles in self.sources:
            state = without(state, module, handles)
        state.pop(STATE, None)
        return state


class Detach:
    """The handle that takes one guard's handle list off a module's ``Stripped`` (and the
    filter itself off the module with the last one)."""

    def __init__(self, module: nn.Module, stripped: Stripped, handles: list[object]) -> None:
        self.module, self.stripped, self.handles = module, stripped, handles

    def remove(self) -> None:
        self.stripped.sources = [s for s in self.stripped.sources if s is not self.handles]
        if not self.stripped.sources and self.module.__dict__.get(STATE) is self.stripped:
            if self.stripped.previous is None:
                del self.module.__dict__[STATE]
            else:
                self.module.__dict__[STATE] = self.stripped.previous


def _touches(module: nn.Module, handles: list[object], dicts: set[int]) -> bool:
    if any(isinstance(h, (Unset, Appended)) and h.obj is module for h in handles):
        return True
    return any(id(v) in dicts for v in vars(module).values() if isinstance(v, dict))


def keep_off_pickles(roots: Iterable[nn.Module], handles: list[object]) -> None:
    """Give every module under ``roots`` that ``handles`` touch the filter (module docstring),
    and ``handles`` the handle that removes it."""
    dicts = set(_dropped_ids(handles))
    seen: set[int] = set()
    for root in roots:
        for module in root.modules():
            if id(module) in seen or not _touches(module, handles, dicts):
                continue
            seen.add(id(module))
            stripped = module.__dict__.get(STATE)
            if not isinstance(stripped, Stripped):
                stripped = module.__dict__[STATE] = Stripped(module)
            stripped.sources.append(handles)
            handles.append(Detach(module, stripped, handles))
