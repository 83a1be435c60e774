"""What the conformance suite trains when it is pointed at someone else's model and comm hook.

The target protocol (the README's "Run the conformance suite on your own model"):

  ``FACTORY()``                        returns a ``Target``: the module, a deterministic batch
                                       function of (step, rank, world size), and a loss;
  ``CALLABLE(ddp_model, process_group)``  registers the user's comm hook on the DDP model (or
                                       calls ``harden``); omitted = stock DDP.

Under ``--openclaw-wrapper fsdp2-tp`` the ``Target`` also carries ``tp_plan(model, tp_mesh)``:
the user's tensor-parallel plan (their ``parallelize_module`` calls), which returns the modules
to ``fully_shard`` over dp before the root; ``batch`` is then called with the data-parallel
index and size, so every tp rank of a dp group gets the same batch (``tp_run``).

Both are named by ``"MODULE:NAME"`` strings, never passed as objects: every rank process is
spawned and imports them itself. ``TargetSpec`` carries the strings; ``validate_spec`` imports
and tries them in the parent, so bad input fails in one line (``BadInput``, exit 2; a pytest
usage error) before any rank starts.

Invariant of a ``Target``: ``batch(step, rank, world_size)`` returns ``(inputs, labels)`` with
the same number of samples on every rank, and ``loss`` is a mean over the samples. The
equivalence check's reference is stock DDP on these very shards (``oracle``); whether stock
DDP also equals one process on the concatenated global batch is a property of the model
(true for a model that treats every sample alone, false under BatchNorm, in-batch losses or
batch-level branches), reported beside the checks.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from openclaw_ref.cli.choices import WRAPPERS
from openclaw_ref.sync.errors import BadInput

Batch = tuple[Any, Any]  # (inputs: a tensor or a tuple of forward arguments, labels)


@dataclass(frozen=True)
class Target:
    """A model and how to train it: ``loss(module(*inputs), labels)`` on ``batch(step, rank,
    world_size)``. ``lr``: the SGD step the checks train with; ``find_unused_parameters``: what
    DDP must be told (a model whose forward may skip parameters needs True). ``tp_plan``
    (``--openclaw-wrapper fsdp2-tp`` only, where it is required): ``tp_plan(model, tp_mesh)``
    applies the user's TP plan to the unsharded model in place and returns the modules to
    ``fully_shard`` over dp before the root, in order (torchtitan: each block; empty or None:
    the root alone)."""

    module: Any  # torch.nn.Module (not imported here: the pytest plugin loads this module)
    batch: Callable[[int, int, int], Batch]
    loss: Callable[[Any, Any], Any]
    lr: float = 0.05
    find_unused_parameters: bool = False
    tp_plan: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class TargetSpec:
    """What to test, as importable names: ``model`` (``MODULE:FACTORY``; None = the openclaw
    model), ``hook`` (``MODULE:CALLABLE``; None = stock DDP), the world size and the wire the
    hook sends (a ``sync.base.Wire`` value: it sets the equivalence tolerance), and the wrapper
    (``ddp``; ``fsdp2``/``hsdp``/``fsdp2-tp``: ``fully_shard``, and ``hook`` names
    ``CALLABLE(fsdp_model, mesh)`` that hardens it — ``with_default_subject`` fills in
    ``harden()`` — while None is the stock wrapper, the oracle)."""

    model: str | None = None
    hook: str | None = None
    world_size: int = 2
    wire: str = "fp32"
    wrapper: str = "ddp"  # one of WRAPPERS: what wraps the model (``--openclaw-wrapper``)

    @property
    def factory(self) -> str:
        return self.model or OPENCLAW_FACTORY

    @property
    def is_openclaw(self) -> bool:
        return self.model is None


OPENCLAW_FACTORY = "openclaw_ref.conformance.target:openclaw_target"
# --openclaw-wrapper (ddp, fsdp2, hsdp, fsdp2-tp; ddp is the default): ``cli.choices.WRAPPERS``
FSDP_WRAPPERS = ("fsdp2", "hsdp")
TP_WRAPPER = "fsdp2-tp"  # FSDP2 x tensor parallel on a (W/2, 2) (dp, tp) mesh: ``tp_run``
TP_SIZE = 2  # the tp dim of fsdp2-tp's mesh
# the subject of every wrapper but ddp when --openclaw-hook names none
FSDP_HARDEN = "openclaw_ref.conformance.fsdp_run:harden_defaults"


def default_world_size(wrapper: str) -> int:
    """``--openclaw-world-size``'s default: 4 under fsdp2-tp (a 2 x 2 mesh), else 2."""
    return 2 * TP_SIZE if wrapper == TP_WRAPPER else 2


def with_default_subject(spec: TargetSpec) -> TargetSpec:
    """Under ``fsdp2``/``hsdp``/``fsdp2-tp`` the subject is ``harden()`` with its defaults
    unless ``--openclaw-hook`` names another; the stock wrapper (hook None) is the oracle."""
    if spec.wrapper != "ddp" and spec.hook is None:
        return replace(spec, hook=FSDP_HARDEN)
    return spec


def resolve(name: str, what: str) -> Any:
    """The object a ``"MODULE:NAME"`` string names; ``BadInput`` naming ``what`` otherwise."""
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise BadInput(f"{what} {name!r} must be MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error, or anything the module raises on import
        raise BadInput(f"{what} {name!r}: cannot import {module_name}: "
                       f"{type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BadInput(f"{what} {name!r}: module {module_name} has no {attr!r}") from None


def build_target(factory: str) -> Target:
    """Call ``factory`` and check that it returned a ``Target``."""
    fn = resolve(factory, "--openclaw-model")
    _require_arity(fn, 0, "--openclaw-model", factory)
    target = fn()
    if not isinstance(target, Target):
        raise BadInput(f"--openclaw-model {factory!r} returned {type(target).__name__}, not "
                       f"openclaw_ref.conformance.target.Target")
    return target


def load_hook(name: str | None) -> Callable | None:
    """The user's ``CALLABLE(ddp_model, process_group)``, or None for stock DDP."""
    if name is None:
        return None
    fn = resolve(name, "--openclaw-hook")
    _require_arity(fn, 2, "--openclaw-hook", name)
    return fn


def _require_arity(fn: Any, n: int, what: str, name: str) -> None:
    if not callable(fn):
        raise BadInput(f"{what} {name!r} is a {type(fn).__name__}, not a callable")
    try:
        inspect.signature(fn).bind(*([None] * n))
    except TypeError:
        raise BadInput(f"{what} {name!r} must take {n} positional argument(s); its signature "
                       f"is {inspect.signature(fn)}") from None
    except ValueError:  # no signature to read (a builtin): let the call decide
        pass


def global_batch(target: Target, step: int, world_size: int,
                 ranks: Sequence[int] | None = None) -> Batch:
    """Every rank's shard of ``step`` (or those of ``ranks``) concatenated in rank order: what
    one process trains on."""
    import torch

    shards = [target.batch(step, r, world_size) for r in (ranks or range(world_size))]
    inputs = [_as_tuple(s[0]) for s in shards]
    joined = tuple(torch.cat(parts) if isinstance(parts[0], torch.Tensor) else parts[0]
                   for parts in zip(*inputs))
    return joined, torch.cat([s[1] for s in shards])


def _as_tuple(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def forward_loss(target: Target, module: Any, batch: Batch) -> Any:
    inputs, labels = batch
    return target.loss(module(*_as_tuple(inputs)), labels)


def check_fits(target: Target, factory: str, world_size: int) -> None:
    """The model trains at ``world_size``: each rank's batch is an (inputs, labels) pair with
    the same number of samples (at least one), and the loss is a scalar tensor."""
    import torch

    sizes = []
    for rank in range(world_size):
        shard = target.batch(0, rank, world_size)
        if not (isinstance(shard, tuple) and len(shard) == 2
                and isinstance(shard[1], torch.Tensor)):
            raise BadInput(f"--openclaw-model {factory!r}: batch(0, {rank}, {world_size}) must "
                           f"return (inputs, labels tensor)")
        sizes.append(shard[1].shape[0] if shard[1].dim() else 0)
    if min(sizes) < 1 or len(set(sizes)) > 1:
        raise BadInput(f"--openclaw-model {factory!r} does not fit world size {world_size}: "
                       f"samples per rank {sizes} (each rank needs the same number, >= 1)")
    loss = forward_loss(target, target.module, target.batch(0, 0, world_size))
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
        raise BadInput(f"--openclaw-model {factory!r}: loss must return a scalar tensor")


def validate_spec(spec: TargetSpec) -> None:
    """Every check that can run before a rank starts; ``BadInput`` (one line) on the first."""
    from openclaw_ref.sync.base import Wire

    if spec.world_size < 2:
        raise BadInput(f"--openclaw-world-size must be >= 2; got {spec.world_size}")
    if spec.wire not in set(Wire):
        raise BadInput(f"--openclaw-wire must be one of {', '.join(Wire)}; got {spec.wire!r}")
    validate_wrapper(spec)
    load_hook(spec.hook)
    target = build_target(spec.factory)
    if spec.wrapper == TP_WRAPPER:
        check_tp_plan(target, spec.factory)
    check_fits(target, spec.factory, data_parallel_size(spec))


def data_parallel_size(spec: TargetSpec) -> int:
    """How many batches a step takes: one per rank, or under fsdp2-tp one per dp group."""
    return spec.world_size // TP_SIZE if spec.wrapper == TP_WRAPPER else spec.world_size


def check_tp_plan(target: Target, factory: str) -> None:
    """Under fsdp2-tp the target must say how it is split over tp (``Target.tp_plan``)."""
    if target.tp_plan is None:
        raise BadInput(f"--openclaw-wrapper {TP_WRAPPER} needs a tensor-parallel plan: "
                       f"--openclaw-model {factory!r} returned a Target without tp_plan "
                       f"(tp_plan(model, tp_mesh) calls parallelize_module and returns the "
                       f"modules to fully_shard over dp; docs/conformance.md)")
    _require_arity(target.tp_plan, 2, "the tp_plan of --openclaw-model", factory)


def validate_wrapper(spec: TargetSpec) -> None:
    """``--openclaw-wrapper`` against the other options, before a rank starts."""
    if spec.wrapper not in WRAPPERS:
        raise BadInput(f"--openclaw-wrapper must be one of {', '.join(WRAPPERS)}; "
                       f"got {spec.wrapper!r}")
    if spec.wrapper == "ddp":
        return
    if spec.model is None:
        raise BadInput(f"--openclaw-wrapper {spec.wrapper} needs --openclaw-model: the openclaw "
                       f"model's gated experts leave parameters unused per rank, which "
                       f"fully_shard cannot reduce")
    if spec.wrapper == "hsdp" and (spec.world_size < 4 or spec.world_size % 2):
        raise BadInput(f"--openclaw-wrapper hsdp shards over 2 ranks and replicates over "
                       f"world size / 2 (a (W/2, 2) mesh: 4 ranks give 2x2): it needs an even "
                       f"--openclaw-world-size >= 4; got {spec.world_size}")
    if spec.wrapper == TP_WRAPPER and (spec.world_size < 2 * TP_SIZE
                                       or spec.world_size % TP_SIZE):
        raise BadInput(f"--openclaw-wrapper {TP_WRAPPER} splits the model over {TP_SIZE} tp "
                       f"ranks and shards it over world size / {TP_SIZE} (a (W/{TP_SIZE}, "
                       f"{TP_SIZE}) (dp, tp) mesh: 4 ranks give 2x2): it needs an even "
                       f"--openclaw-world-size >= {2 * TP_SIZE}; got {spec.world_size}")
    if spec.wire not in ("native", "fp32"):
        raise BadInput(f"--openclaw-wire {spec.wire} does not apply to --openclaw-wrapper "
                       f"{spec.wrapper}: FSDP2's MixedPrecisionPolicy sets its reduce dtype "
                       f"and harden() sends FSDP2's own reduction (native or fp32 only)")


def openclaw_target() -> Target:
    """The suite's own model as a ``Target``: the tiny openclaw preset on its skill dataset (the
    default when no ``--openclaw-model`` is given)."""
    import torch.nn.functional as F

    from openclaw_ref.core.config import ModelSection
    from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
    from openclaw_ref.core.model import build_model

    cfg = ModelSection().model_config()
    ds = SkillDataset(cfg, DataConfig(seed=1))

    def batch(step: int, rank: int, world_size: int) -> Batch:
        b = rank_batch(ds, step, 4 * world_size, rank, world_size)
        return (b.tokens, b.sample_ids, step), b.labels

    return Target(build_model(cfg), batch, F.cross_entropy, lr=0.05, find_unused_parameters=True)
