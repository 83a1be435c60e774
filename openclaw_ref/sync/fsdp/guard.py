"""``harden()`` on an FSDP2 model (``fully_shard``; a 1-D mesh, or HSDP's 2-D (replicate,
shard) mesh): FSDP2's own reduction untouched, and ONE small exchange per step, at the
optimizer step's pre-hook, before the optimizer applies anything.

Hook points, per rank (torch 2.13, measured in ``docs/fsdp2.md``):
  1. a post-accumulate-grad hook on every sharded (DTensor) parameter, which FSDP2 runs after
     the reduce-scatter (and HSDP's all-reduce) of its group: counts how often each parameter's
     gradient was reduced since the last optimizer step (no-sync micro-steps reduce nothing),
     and keeps a copy of this rank's shard of it where the scale check samples it (``scale``);
  2. the reduce-scatter itself (``FSDPModule.set_custom_reduce_scatter``), wrapped, not
     replaced (``hooks``): the wrapper sums this rank's own flattened gradients (NaN/±inf
     iff one is: the local non-finite flag, before the sum mixes the ranks) and calls FSDP2's
     own comm with the same arguments — the same collective, bit for bit. FSDP2 calls it only
     where the shard dimension has more than one rank. A short input (a parameter of the group
     without a gradient here) first leaves a note in the store (``last_words``), as does a
     backward that reduces fewer than all groups (3); the all-gather is wrapped too, and
     when either collective fails, or waits the watchdog's deadline (its ``Work`` watched),
     the notes say why: a rank without a gradient, or with gradient sync off, named by the
     ranks whose collective failed or hung (else gloo's error stands, or the wait goes on);
  3. the root's output: a pre-hook on its ``grad_fn`` counts backwards (one per graph task),
     and leaves the backward's note (how many FSDP groups will reduce) for ``last_words``;
  4. the optimizer step pre-hook (``torch.optim``'s global one, or only ``optimizer``'s when
     ``harden(model, optimizer=…)`` names it): the step's exchange (``facts.Field``) —
     clock (optimizer steps, backwards), ``load_state_dict`` calls, what was reduced, the
     non-finite flag, the uniform factor applied to the reduced gradients since
     (``scale``), whether the optimizer holds the model's parameters, its
     hyperparameters' digest, on HSDP a replica slice's digest — one int64 allreduce of
     ``world × len(Field)`` (12) elements; every rank judges the same rows
     (``facts.judge``);
  5. the root's forward pre-hook (ahead of FSDP2's own): a forward that follows a reduced
     backward with no optimizer step between (an extra micro-batch) sends its row first, so a
     rank running one more forward/backward meets its peers' optimizer-step exchange, with the
     same collective, and is named — before its all-gathers pair with their next step's;
  6. ``load_state_dict`` post-hooks on every module (``hooks.LoadCounter``);
  7. ``close()`` on HSDP: every shard compared once more across its replicas
     (``close``: ``GuardBase``'s close-time check over the whole mesh), so a drift after the
     last digested slice is not lost when the run ends.

The guard's ``clock`` is its optimizer steps (the step every rank must agree on); what the
notes compare (``last_words.Clock``: optimizer steps, backwards, groups syncing) is
``position()``.

Invariant: every rank issues the same exchanges in the same order unless its clock differs,
and then the first exchange where it differs is one its peers issue too (2, 4 or 5), so the
mismatch is raised on every rank instead of gloo aborting a process or timing out.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

from openclaw_ref.sync.base import NonFinitePolicy, RankInfo, SyncConfig
from openclaw_ref.sync.canary.row import canary_summary
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.heartbeat import STEP_EXCHANGE
from openclaw_ref.sync.evidence.precision import nonfinite_flags
from openclaw_ref.sync.fsdp.close import close_replica_check
from openclaw_ref.sync.fsdp.facts import Exchange, Field, hyper_digest, judge, reduced_digest
from openclaw_ref.sync.fsdp.hooks import (
    CheckedAllGather,
    CheckedReduceScatter,
    LoadCounter,
    Restore,
)
from openclaw_ref.sync.fsdp.inputs import InputDigest
from openclaw_ref.sync.fsdp.last_words import Clock, GroupPlan, LastWords, group_plan
from openclaw_ref.sync.fsdp.mesh import (
    exchange_group,
    policy_manifest,
    seats,
    tensor_parallel_dims,
)
from openclaw_ref.sync.fsdp.replicas import Finding, Replicas
from openclaw_ref.sync.fsdp.scale import ScaleRecord, to_bits, tolerance, unit_roundoff
from openclaw_ref.sync.guard import GuardBase
from openclaw_ref.sync.target import validate_fsdp_target


def harden_fsdp(model: FSDPModule, cfg: SyncConfig, optimizer: torch.optim.Optimizer | None,
                ctx: RankInfo | None) -> FSDPGuard:
    """``harden()`` for an FSDP2 root module: refuse what cannot be guarded (before anything is
    registered or any collective), compare the parameter manifests (names, global shapes,
    dtypes, order: one all-gather of a digest), then register the hooks."""
    validate_fsdp_target(model, cfg)
    guard = FSDPGuard(model, cfg, optimizer)
    checks.construction_check(guard.manifest(), group=guard.group)
    guard.watch(ctx)
    guard.install()
    guard.mark(model)
    return guard


class FSDPGuard(GuardBase):
    """One per hardened FSDP2 root module (the surface: ``GuardBase``; ``finish_step`` is
    always True: the verdict is read at the optimizer step's pre-hook)."""

    def __init__(self, model: FSDPModule, cfg: SyncConfig,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(cfg, exchange_group(model))
        self.module, self.optimizer = model, optimizer
        self.tracked = [(n, p) for n, p in model.named_parameters()
                        if p.requires_grad and isinstance(p, DTensor)]
        self.names = [n for n, _ in self.tracked]
        self._ids = {id(p) for _, p in self.tracked}
        self._full_shapes = Counter(tuple(p.shape) for _, p in self.tracked)
        tp = tensor_parallel_dims(model)
        self.seats = seats(model, self.tracked)
        self.replicas = Replicas(self.seats, self._local_shards(), cfg.replica_slices)
        self.inputs = InputDigest(model, bool(tp))
        self.counts = [0] * len(self.tracked)  # reductions since the last optimizer step
        u = unit_roundoff([p.dtype for _, p in self.tracked])
        self.scales = ScaleRecord([p.numel() for _, p in self.tracked], u)
        self.scale_tol = tolerance(u)
        self.loads: LoadCounter | None = None
        self.local_sums: list[torch.Tensor] = []
        self.backwards = self.backwards_at_step = 0
        self.block = torch.zeros(self.world_size, len(Field) + self.replicas.width,
                                 dtype=torch.int64)
        self.last_words: LastWords | None = None
        self._fsdp_groups: list = []  # every FSDP param group (``reduce_grads``: syncing)
        self.exchanges = self.passed = self.extra_forward_exchanges = 0
        self._task = -2

    # -- registration ---------------------------------------------------------------------------
    def install(self) -> None:
        """Register the hooks of the module docstring (1-5); every one is undone by ``close``."""
        for i, (_, p) in enumerate(self.tracked):
            self.handles.append(p.register_post_accumulate_grad_hook(self._reduced(i)))
        self.loads = LoadCounter(self.module)
        self.handles.append(self.loads)
        plans: list[GroupPlan] = []
        for name, module in self.module.named_modules():
            if isinstance(module, FSDPModule):
                self._fsdp_groups += module._get_fsdp_state()._fsdp_param_groups
                self._wrap_comms(name, module, plans)
        if self.watchdog is not None:
            self.last_words = LastWords(self.watchdog.store, self.watchdog.namespace, self.rank,
                                        self.global_ranks, plans, len(self._fsdp_groups))
        self.handles.append(self.module.register_forward_pre_hook(
            self._forward_pre, prepend=True, with_kwargs=True))
        self.handles.append(self.module.register_forward_hook(self._forward_post))
        self.handles.append(register_optimizer_step_pre_hook(self._optimizer_step))

    def _wrap_comms(self, name: str, module: FSDPModule, plans: list[GroupPlan]) -> None:
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) != 1:  # none (no parameters of its own), or per-parameter meshes
            return
        index = len(plans)
        plans.append(group_plan(name, groups[0], {id(p): n for n, p in self.tracked}))
        reduce_scatter = CheckedReduceScatter(
            groups[0]._reduce_scatter_comm, self.local_sums,
            lambda numel: self._before_reduce_scatter(index, numel),
            lambda numel: self._explain_failure(index, numel), self._watch(index))
        all_gather = CheckedAllGather(groups[0]._all_gather_comm,
                                      lambda: self._explain_failure(None, None),
                                      self._watch(None))
        module.set_custom_reduce_scatter(reduce_scatter)
        module.set_custom_all_gather(all_gather)
        self.handles.append(Restore(module, reduce_scatter, all_gather))

    def _before_reduce_scatter(self, index: int, numel: int) -> None:
        """Before FSDP2's own collective: the short note (``last_words``)."""
        if not self.closed and self.last_words is not None:
            self.last_words.before_reduce_scatter(index, numel, self.position)

    def _watch(self, index: int | None):
        """A wrapper's collective for the watchdog: overdue, explained as a failed one."""
        return None if self.watchdog is None else lambda work, numel: self.watchdog.outside.add(
            work, lambda: self._explain_failure(index, numel, hung=True))

    def _explain_failure(self, index: int | None, numel: int | None, *, hung: bool = False
                         ) -> ConsistencyError | None:
        """FSDP2's reduce-scatter of group ``index`` (or an all-gather: None) failed on this rank,
        or waited the watchdog's deadline (``hung``): what the notes show (``last_words``),
        reported at once and left for the peers, or None (gloo's error stands)."""
        self.failed = self.failed or not hung
        if self.last_words is None or self.closed:
            return None
        error = self.last_words.diagnose(self.position(), index, numel)
        if error is not None:
            self.failed = True
            self.events.append(error.event())
            print(f"openclaw: {error}", file=sys.stderr, flush=True)
            self.watchdog.declare_failed(error)
        return error

    def position(self) -> Clock:
        """Where this rank is, as the notes compare it: optimizer steps, backwards, and the
        FSDP groups whose gradient sync is on."""
        syncing = sum(bool(group.reduce_grads) for group in self._fsdp_groups)
        return Clock(self.clock, self.backwards, syncing)

    def _reduced(self, i: int):
        """Parameter ``i``'s post-accumulate-grad hook: FSDP2 runs it once per reduction of its
        gradient (module docstring, 1), never on a no-sync backward; the norms of this rank's
        shard of it, overwritten at each accumulation."""
        counts, scales = self.counts, self.scales

        def reduced(p: torch.Tensor) -> None:
            counts[i] += 1
            scales.reduced(i, _local_grad(p))
        return reduced

    # -- the step -------------------------------------------------------------------------------
    def _forward_pre(self, module, args, kwargs) -> None:
        """Ahead of FSDP2's own pre-forward (its all-gathers): the extra forward's exchange
        (module docstring, 5), and a watchdog diagnosis left from the last exchange."""
        if self.closed or not torch.is_grad_enabled():
            return
        self._check_watchdog()
        self.inputs.forward((args, kwargs))
        if any(self.counts):  # a reduced backward, and no optimizer step since
            self.extra_forward_exchanges += 1
            self._exchange(Exchange.EXTRA_FORWARD, None, True)

    def _forward_post(self, module, args, output) -> None:
        """Count the backward of this output once it starts (module docstring, 3): one per
        graph task, so an output used twice in one loss is one backward."""
        if self.closed or not torch.is_grad_enabled():
            return
        out = next((t for t in _leaves(output) if t.grad_fn is not None), None)
        if out is not None:
            out.grad_fn.register_prehook(lambda grads: self._backward_started())

    def _backward_started(self) -> None:
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            self.backwards += 1
            if self.closed:
                return
            if self.last_words is not None:
                self.last_words.backward_started(self.position())

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        """The step's exchange, for the model's optimizer: the one passed to ``harden``, or
        one that holds the model's parameters, or one that holds tensors shaped like all of
        them but none of them (the optimizer built before ``fully_shard``)."""
        if self.closed or (self.optimizer is not None and optimizer is not self.optimizer):
            return
        held = [p for group in optimizer.param_groups for p in group["params"]]
        owns = any(id(p) in self._ids for p in held)
        if not owns and not (self.optimizer is not None or self._shaped_like_model(held)):
            return  # another model's optimizer
        self._exchange(Exchange.OPTIMIZER_STEP, optimizer, owns)
        self.clock += 1
        self.backwards_at_step = self.backwards
        self.counts[:] = [0] * len(self.counts)
        self.inputs.reset()
        self.scales.clear()
        self.local_sums.clear()

    def _shaped_like_model(self, held: list[torch.Tensor]) -> bool:
        shapes = Counter(tuple(p.shape) for p in held if not isinstance(p, DTensor))
        return bool(shapes) and shapes == self._full_shapes

    def _row(self, kind: Exchange, optimizer, owns: bool) -> list[int]:
        row = [0] * len(Field)
        row[Field.KIND] = kind
        row[Field.OPT_STEPS] = self.clock
        row[Field.BACKWARDS] = self.backwards
        row[Field.REDUCED] = reduced_digest(self.names, self.counts)
        row[Field.NOT_REDUCED] = int(self.backwards > self.backwards_at_step
                                     and not any(self.counts))
        row[Field.NONFINITE] = int(nonfinite_flags(self.local_sums)[0])
        row[Field.OPT_OWNS] = int(owns)
        row[Field.HYPER] = hyper_digest(optimizer) if optimizer is not None else 0
        row[Field.LOADS] = self.loads.count if self.loads is not None else 0
        if kind is Exchange.OPTIMIZER_STEP:
            watched = self.scales.watched
            row[Field.SCALE] = to_bits(self.scales.factor(
                [_local_grad(p) if i in watched else None for i, (_, p) in
                 enumerate(self.tracked)]))
        if kind is not Exchange.OPTIMIZER_STEP:
            return row + [0] * self.replicas.width
        row[Field.INPUT_OF], row[Field.INPUT] = self.inputs.column()
        return row + self.replicas.columns(self.clock, self._local_shards(), self._grads())

    def _grads(self) -> list[torch.Tensor | None]:
        return [_local_grad(p) for _, p in self.tracked]

    def manifest(self) -> list[tuple[str, torch.Tensor]]:
        return policy_manifest(self.module, self.tracked)

    def _local_shards(self) -> list[tuple[str, torch.Tensor]]:
        """This rank's shard of every guarded parameter, as plain tensors (HSDP: equal on the
        ranks that share its shard coordinate, bitwise, between optimizer steps)."""
        with torch.no_grad():
            return [(n, p.to_local().detach()) for n, p in self.tracked]

    def _exchange(self, kind: Exchange, optimizer, owns: bool) -> None:
        """Send this rank's row, wait (under the watchdog and the group's timeout), judge."""
        self.block.zero_()
        self.block[self.rank] = torch.tensor(self._row(kind, optimizer, owns))
        step = self.clock
        work = dist.all_reduce(self.block, group=self.group, async_op=True)
        if self.watchdog is not None:
            self.watchdog.issued(step, STEP_EXCHANGE, work)
        try:
            work.wait()
        except RuntimeError as exc:
            self._collective_failed(exc, step)
        finally:
            if self.watchdog is not None:
                self.watchdog.settled(step)
        self.exchanges += 1
        error, events = judge(self.block.tolist(), self.global_ranks,
                              self.cfg.nonfinite is NonFinitePolicy.RAISE,
                              max(self.replicas.k, 1), self.scale_tol, self.replicas,
                              self._name_parameters)
        self.events.extend(events)
        if error is not None:
            self.fail(error)
        self.passed += 1

    def _name_parameters(self, finding: Finding) -> list[str]:
        """The parameters of a replica class that differ (``replicas.name_parameters``: one
        gather, on every rank, on the failure path)."""
        return self.replicas.name_parameters(finding, self._local_shards(), self._grads(),
                                             self.group)

    def fail(self, error: ConsistencyError) -> NoReturn:
        """Raise ``error``, a check of this guard's (its canary's too), as the guard's own:
        recorded as an event, and no close-time check after it."""
        self.failed = True
        self.events.append(error.event())
        raise error

    # -- the user's entry points (as the DDP guard's) --------------------------------------------
    def begin_step(self, step: int) -> None:
        self._check_watchdog()

    def finish_step(self, step: int | None = None) -> bool:
        return True

    def step_metrics(self) -> dict:
        return {"exchanges": self.exchanges}

    def held_bytes(self) -> int:
        return self.block.numel() * self.block.element_size()

    def summary(self) -> dict:
        return {"guard": self.cfg.guard.value, "wrapper": type(self.module).__name__,
                "checks_run": self.exchanges, "checks_passed": self.passed,
                "replica_checks": self.clock if self.replicas.enabled else 0,
                "optimizer_steps": self.clock, "backwards": self.backwards,
                "extra_forward_exchanges": self.extra_forward_exchanges,
                "notes": dict(self.last_words.written) if self.last_words else {},
                "nonfinite": self.cfg.nonfinite.value,
                "replicas": self.replicas.summary(), "input_check": self.inputs.off or "on",
                "canary": canary_summary(self.canary, self.canary_off)}

    def _verify_replicas(self) -> None:
        """On HSDP, every shard compared once more across its replicas, over the whole mesh
        (module docstring, 7); ``GuardBase.close`` runs it where due, then the teardown puts
        FSDP2's own comms back."""
        close_replica_check(self, self._local_shards(), self.replicas.keys)


def _local_grad(p: torch.Tensor) -> torch.Tensor | None:
    """This rank's shard of ``p``'s gradient (a DTensor under FSDP2), or None."""
    g = p.grad
    return g.to_local() if isinstance(g, DTensor) else g


def _leaves(output) -> list[torch.Tensor]:
    return [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
