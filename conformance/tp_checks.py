"""The checks of ``--openclaw-wrapper fsdp2-tp`` on a user's 2-D model (``tp_run``), judged in the
parent from the records of ``oracle.TargetRuns`` — stock FSDP2 × TP twice (its second run is
its own noise), the subject once — and from one pool task per fault case:

  equivalence    every rank ends every step bit for bit where stock ends it
                 (``user_checks.equivalence_from``, as under fsdp2/hsdp);
  no alarm       the subject raised nothing, recorded no event but ``CanaryOff`` (the compute
                 canary cannot run on a TP model and says so: docs/meshes.md), and gave no
                 warning stock did not give, on any rank;
  tp replicas    under stock, every tp-replicated parameter is bitwise equal across its tp
                 group after every step: the user's plan keeps the copies equal. A failure
                 names the first step, the parameters and the ranks of each group that split;
  faults         each ``tp_run.TpFault`` on rank ``FAULT_RANK`` from step 0: stock trains
                 through it silently (its parameters change, nothing is raised), and the
                 subject must raise one of ``EXPECTED``'s kinds at step 0 naming that rank,
                 the same error on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from openclaw_ref.conformance.fault_matrix import CaseOutcome
from openclaw_ref.conformance.oracle import STOCK_WRAPPER, Oracle, Runs, TargetRuns
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.settings import CheckResult
from openclaw_ref.conformance.target import TargetSpec
from openclaw_ref.conformance.tp_run import FAULT_RANK, TpFault, TpOptions, tp_case_task
from openclaw_ref.conformance.user_checks import equivalence_from, run_failed, strategy_label
from openclaw_ref.core.launch import RankPool
from openclaw_ref.sync.hardening import CANARY_OFF

OPTIONS = TpOptions()
CASE_TIMEOUT_S = 180.0
EXPECTED: dict[TpFault, tuple[str, ...]] = {
    # the input digest where the plan's first TP module takes its input replicated over tp;
    # else the gradients of the tp-replicated parameters the other batch moved
    TpFault.OTHER_BATCH: ("InputMismatch", "GradientsNotAveraged"),
    TpFault.LR_ONE_RANK: ("OptimizerMismatch",),
}


def oracle_of(target_runs: TargetRuns, spec: TargetSpec) -> Oracle:
    """Stock FSDP2 × TP on the spec's model (run first, so a warning torch gives once per
    process falls to stock, never to the subject)."""
    return target_runs.oracle(spec, OPTIONS)


def equivalence(target_runs: TargetRuns, spec: TargetSpec) -> CheckResult:
    oracle = oracle_of(target_runs, spec)
    return equivalence_from(spec, "default", oracle, target_runs.runs(spec, OPTIONS))


def no_alarm(target_runs: TargetRuns, spec: TargetSpec) -> CheckResult:
    """The subject against stock: no error, no event but ``CanaryOff``, no warning added."""
    oracle = oracle_of(target_runs, spec)
    return judge_no_alarm(spec, oracle.runs, target_runs.runs(spec, OPTIONS))


def judge_no_alarm(spec: TargetSpec, stock: list[RunRecord], runs: Runs) -> CheckResult:
    name = "no alarm (error, event or warning)"
    if runs.records is None:
        return run_failed(name, spec, runs)
    stopped = next((r for r in runs.records if r.error is not None), None)
    if stopped is not None:
        return CheckResult(name, strategy_label(spec), False,
                           f"the run of your plan with no fault injected stopped: "
                           f"{stopped.error_text}", {}, stopped.error)
    events = {r.rank: [e["kind"] for e in r.events if e["kind"] != CANARY_OFF]
              for r in runs.records}
    added = {r.rank: sorted(set(r.warnings) - set(o.warnings))
             for r, o in zip(runs.records, stock, strict=True)}
    figures = {"events": {r: k for r, k in events.items() if k},
               "added_warnings": {r: w for r, w in added.items() if w},
               "canary": sorted({e["detail"] for r in runs.records for e in r.events
                                 if e["kind"] == CANARY_OFF})}
    if figures["events"] or figures["added_warnings"]:
        return CheckResult(name, strategy_label(spec), False,
                           f"on a healthy run: events {figures['events']}, warnings "
                           f"{STOCK_WRAPPER[spec.wrapper]} did not give "
                           f"{figures['added_warnings']}", figures,
                           {"kind": "FalseAlarm", "ranks": sorted({*figures["events"],
                                                                   *figures["added_warnings"]})})
    return CheckResult(name, strategy_label(spec), True,
                       f"no error, no event but {CANARY_OFF}, no warning "
                       f"{STOCK_WRAPPER[spec.wrapper]} did not give, on "
                       f"{len(runs.records)} ranks", figures)


def tp_replicas(target_runs: TargetRuns, spec: TargetSpec) -> CheckResult:
    """Stock's tp-replicated parameters over their tp groups (module docstring)."""
    oracle = oracle_of(target_runs, spec)
    stock = replace(spec, hook=None)
    if oracle.runs is None:
        return run_failed("tp replicas", stock, Runs(None, oracle.error))
    return judge_tp_replicas(stock, oracle.runs)


def split_groups(records: list[RunRecord], step: int) -> dict[str, list[list[int]]]:
    """Each tp-replicated parameter whose copies differ after ``step``: the ranks of every
    replica group (ranks with one replica key) holding more than one digest."""
    held: dict[str, dict[int, dict[int, str]]] = {}
    for record in records:
        for name, (key, digest) in record.tp_replicas[step].items():
            held.setdefault(name, {}).setdefault(key, {})[record.rank] = digest
    return {name: [sorted(g) for g in groups.values() if len(set(g.values())) > 1]
            for name, groups in held.items()
            if any(len(set(g.values())) > 1 for g in groups.values())}


def judge_tp_replicas(spec: TargetSpec, records: list[RunRecord]) -> CheckResult:
    name, stock = "tp replicas", STOCK_WRAPPER[spec.wrapper]
    steps = min(len(r.tp_replicas) for r in records)
    replicated = list(records[0].tp_replicas[0]) if steps else []
    figures = {"params": replicated, "steps": steps}
    for step in range(steps):
        split = split_groups(records, step)
        if split:
            names = [n for n in records[0].param_names if n in split]
            groups = sorted({tuple(g) for n in names for g in split[n]})
            ranks = sorted({r for g in groups for r in g})
            figures.update(split={n: split[n] for n in names})
            return CheckResult(
                name, stock, False,
                f"under {stock}, tp-replicated parameters differ across their tp group after "
                f"step {step}: {', '.join(names)} (ranks {[list(g) for g in groups]}). Each rank "
                f"of a tp group holds its own copy of these (read from their placements) and "
                f"nothing kept the copies equal: a parameter left out of a sequence-parallel "
                f"plan, whose gradient covers one tp rank's part of the sequence, or tp ranks "
                f"fed different batches (docs/meshes.md)", figures,
                {"kind": "TpReplicasDiffer", "step": step, "ranks": ranks, "params": names})
    if not replicated:
        return CheckResult(name, stock, True, "no parameter is replicated over tp (the plan "
                                              "shards every one): nothing to compare", figures)
    return CheckResult(name, stock, True,
                       f"{len(replicated)} tp-replicated parameters bitwise equal across their "
                       f"tp groups on {len(records)} ranks after each of {steps} steps under "
                       f"{stock}", figures)


def fault_case(target_runs: TargetRuns, get_pool: Callable[[int], RankPool], spec: TargetSpec,
               fault: TpFault) -> CheckResult:
    """One fault case, stock and subject in one pool task, judged against stock's healthy run
    (module docstring)."""
    healthy = oracle_of(target_runs, spec).runs
    replies = get_pool(spec.world_size).run(tp_case_task, spec, fault.value, OPTIONS,
                                            timeout_s=CASE_TIMEOUT_S)
    return judge_fault(spec, fault, replies, healthy)


def judge_fault(spec: TargetSpec, fault: TpFault, replies: list[dict],
                healthy: list[RunRecord]) -> CheckResult:
    changed = any(reply["stock"] != record.param_digests[-1]
                  for reply, record in zip(replies, healthy, strict=True))
    stock = "silent-corruption" if changed else "no-effect"
    raised = [reply["subject"] for reply in replies]
    event = raised[0] or {}
    out = CaseOutcome(strategy_label(spec), fault.value,
                      "detected" if event else stock, kind=event.get("kind", ""),
                      step=event.get("step"), ranks=event.get("ranks", []),
                      params=event.get("params", []), detail=event.get("detail", ""),
                      expected_ranks=[FAULT_RANK])
    out.attributed = (bool(event) and all(e == event for e in raised)
                      and out.kind in EXPECTED[fault] and out.step == 0
                      and FAULT_RANK in out.ranks)
    out.in_time = out.attributed
    said = (f"{STOCK_WRAPPER[spec.wrapper]}: {stock} (it raised nothing"
            f"{', and its parameters changed' if changed else ' and nothing changed'})")
    want = f"expected {' or '.join(EXPECTED[fault])} at step 0 naming rank {FAULT_RANK}"
    detail = f"{out.summary()}; {said}" + ("" if out.attributed else f"; {want}")
    return CheckResult(f"fsdp2-tp fault: {fault.value}", out.strategy, out.attributed, detail,
                       {**out.to_json(), "stock": stock, "expected_kinds": EXPECTED[fault]},
                       {"kind": out.kind, "step": out.step, "ranks": out.ranks}
                       if event else None)
