"""The FSDP2 silent-error corpus: what stock FSDP2 (``fully_shard`` on every layer and the root,
torch 2.13, gloo on CPU) does with each published mistake, run as a plain user script under
torchrun and judged from what each rank wrote. These are measured facts about the stock column,
the ground truth a hardened column will be judged against: four mistakes leave the training
silently wrong, an extra backward on one rank kills the other rank three steps later, a rank
that skips gradient sync hangs every rank until gloo's timeout, and a mixed-precision policy
that differs on one rank kills that rank at the first all-gather. Also the judging itself:
who is named when a rank dies, hangs or only saw its peer vanish.

CI runs the 2-rank corpus in three torchrun jobs (a job ends at the first pattern in which a
rank fails), two at a time; the unused parameter, 4 ranks and HSDP are behind ``slow``. The
``hardened`` column (``harden(model)`` after ``fully_shard``) runs the same patterns on 2 ranks
(slow; its two backward-collective cases also in CI, ``tests/test_fsdp_last_words.py``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from openclaw_ref.core.corpus_faults import Reach
from openclaw_ref.fsdp_corpus.launch import Job, run_job
from openclaw_ref.fsdp_corpus.outcome import (
    Kind,
    RankResult,
    Status,
    classify,
    process_group_intact,
)
from openclaw_ref.fsdp_corpus.patterns import (
    CORPUS,
    NOT_FOUND,
    PATTERNS,
    Column,
    Mesh,
    acting_rank,
)
from openclaw_ref.fsdp_corpus.silent_errors_script import harness_watchdog_s, parse_args
from openclaw_ref.sync.errors import BadInput

ISSUE_NAMES = ("optimizer-before-shard", "extra-backward-one-rank", "no-sync-one-rank",
               "clip-local-norm", "load-one-rank", "mixed-precision-differs")
SILENT = ("optimizer-before-shard", "clip-local-norm", "load-one-rank", "lr-one-rank")
SIZE_MISMATCH = "Received data size doesn't match expected size"
PEER_RESET = "Connection reset by peer"


@pytest.fixture(scope="module")
def stock():
    """The CI corpus on 2 ranks, stock column: every silent pattern and one crash in one job,
    the hang alone (gloo timeout 10 s), the other crash alone; two jobs at a time (the hang's
    job mostly waits: 53 s instead of 75 s for the three here)."""
    jobs = (Job(("none", *SILENT, "extra-backward-one-rank")),
            Job(("no-sync-one-rank",), timeout_s=10), Job(("mixed-precision-differs",)))
    with ThreadPoolExecutor(2) as pool:
        return {k: v for out in pool.map(run_job, jobs) for k, v in out.items()}


# --- the table -------------------------------------------------------------------------------

def test_the_corpus_has_the_six_patterns_the_issue_names():
    assert set(ISSUE_NAMES) <= set(PATTERNS) and len(PATTERNS) == len(CORPUS)


def test_every_pattern_cites_a_public_source_or_says_none_was_found():
    for p in CORPUS:
        if p.url is None:
            assert p.source == NOT_FOUND, p.name
        else:
            assert p.url.startswith("https://github.com/") and p.source != NOT_FOUND, p.name


def test_a_one_rank_pattern_acts_on_rank_one_except_the_rank_zero_load():
    assert acting_rank(PATTERNS["lr-one-rank"], 4) == 1
    assert acting_rank(PATTERNS["load-one-rank"], 4) == 0
    assert PATTERNS["clip-local-norm"].reach is Reach.EVERY_RANK


def test_the_script_accepts_every_pattern_and_a_list_of_them():
    args = parse_args(["--pattern", ",".join(("none", *PATTERNS))])
    assert args.patterns == ["none", *PATTERNS] and args.column == "stock"


def test_an_unknown_pattern_is_refused_in_one_line_before_any_process_group(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--pattern", "none,nope"])
    assert exc.value.code == 2 and "unknown FSDP2 corpus pattern 'nope'" in capsys.readouterr().err


# --- judging: what the ranks wrote -> one outcome ---------------------------------------------

def _res(rank: int, status: Status, step: int = 6, **kw) -> RankResult:
    return RankResult(rank, "p", status, step, **kw)


def test_the_harness_outlasts_harden_s_watchdog_and_its_peers_grace_under_the_hardened_column():
    # harden()'s default 60 s deadline, then half of it for the peers: the harness must not call
    # the run hung first (it did at 2 x 10 + 30 = 50 s, reporting the detection as a hang)
    assert harness_watchdog_s(10, Column.HARDENED, None) > 60 * 1.5
    assert harness_watchdog_s(10, Column.HARDENED, 5) == 2 * 10 + 30
    assert harness_watchdog_s(10, Column.STOCK, None) == 2 * 10 + 30


def test_a_rank_that_died_is_named_not_the_rank_that_saw_its_peer_vanish():
    results = {0: None, 1: _res(1, Status.ERROR, 5, error=f"RuntimeError: {PEER_RESET}")}
    out = classify("p", results, None, lost={0: "died by SIGABRT"}, lost_steps={0: 6})
    assert out.kind is Kind.CRASH and out.ranks == [0] and out.step == 5
    assert "SIGABRT" in out.per_rank[0] and PEER_RESET in out.per_rank[1]


def test_a_rank_the_launcher_terminated_is_never_the_cause():
    results = {0: None, 1: _res(1, Status.ERROR, 2, error=f"RuntimeError: {PEER_RESET}"),
               2: None}
    out = classify("p", results, None, terminated=frozenset({0}))
    assert out.kind is Kind.CRASH and out.ranks == [2]


def test_gloo_timeouts_are_a_hang_on_the_ranks_that_timed_out():
    t = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    results = {0: _res(0, Status.ERROR, 2, error=t), 1: _res(1, Status.WATCHDOG, 2)}
    out = classify("p", results, "x")
    assert out.kind is Kind.HANG and out.ranks == [0, 1] and out.step == 2


def test_a_rank_silent_when_the_launcher_killed_the_job_counts_as_hung():
    out = classify("p", {0: None, 1: _res(1, Status.FINISHED, digest="a"), 2: None}, "a",
                   deadline_hit=True, terminated=frozenset({2}))
    assert out.kind is Kind.HANG and out.ranks == [0, 2]


def test_replicas_that_differ_are_silent_corruption():
    results = {0: _res(0, Status.FINISHED, digest="a"), 1: _res(1, Status.FINISHED, digest="b")}
    out = classify("p", results, "a")
    assert out.kind is Kind.SILENT and "replicas differ" in out.detail


def test_a_result_off_the_run_without_the_mistake_is_silent_corruption():
    results = {r: _res(r, Status.FINISHED, digest="b", max_abs_diff=0.5) for r in (0, 1)}
    out = classify("p", results, "a")
    assert out.kind is Kind.SILENT and out.max_abs_diff == 0.5


def test_a_result_equal_to_the_run_without_the_mistake_is_no_effect():
    results = {r: _res(r, Status.FINISHED, digest="a", max_abs_diff=0.0) for r in (0, 1)}
    assert classify("p", results, "a").kind is Kind.NO_EFFECT


def test_a_detection_is_reported_with_the_ranks_it_names():
    det = {"kind": "ReplicaDivergence", "step": 3, "ranks": [1], "detail": "rank 1 differs"}
    results = {0: _res(0, Status.DETECTED, 3, detection=det),
               1: _res(1, Status.DETECTED, 3, detection=det)}
    out = classify("p", results, "a")
    assert out.kind is Kind.DETECTED and out.ranks == [1] and out.step == 3
    assert process_group_intact(results)


def test_a_detection_made_after_gloo_failed_a_collective_leaves_the_group_broken():
    det = {"kind": "GradientsNotAveraged", "step": 2, "ranks": [1], "collective_failed": True}
    results = {r: _res(r, Status.DETECTED, 2, detection=det) for r in (0, 1)}
    assert not process_group_intact(results)


def test_the_process_group_is_broken_after_any_rank_failed():
    assert not process_group_intact({0: _res(0, Status.FINISHED), 1: None})
    assert not process_group_intact({0: _res(0, Status.FINISHED), 1: _res(1, Status.ERROR)})


# --- stock FSDP2, measured on 2 ranks ---------------------------------------------------------
# Three torchrun jobs (~53-90 s on 2 shared cores): the slow profile (tox -e slow), for the CI
# budget. They assert torch's own behaviour; CI keeps the launcher's and classifier's units above.

def _saw_its_peer_die(account: str) -> bool:
    """The survivor's account of a peer's SIGABRT: its own "Connection reset by peer", or, when
    torchrun's SIGTERM reached it before it had written that (a race), the SIGTERM."""
    return PEER_RESET in account or "died by SIGTERM" in account


@pytest.mark.slow
def test_the_clean_script_ends_bit_identical_to_its_own_reference(stock):
    out = stock["none"]
    assert out["kind"] == "no-effect" and out["max_abs_diff"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name", SILENT)
def test_stock_fsdp2_trains_silently_wrong(stock, name):
    out = stock[name]
    assert out["kind"] == "silent-corruption", out
    assert out["detail"] == "the result differs from the run without the mistake"  # 1-D: one copy
    assert out["max_abs_diff"] > 1e-3
    assert set(out["per_rank"].values()) == {"finished"}


@pytest.mark.slow
def test_an_extra_backward_on_one_rank_kills_the_other_rank_three_steps_later(stock):
    out = stock["extra-backward-one-rank"]
    assert out["kind"] == "crash" and out["ranks"] == [0], out
    assert "SIGABRT" in out["per_rank"]["0"] and SIZE_MISMATCH in out["per_rank"]["0"]
    assert _saw_its_peer_die(out["per_rank"]["1"]) and out["step"] == 5  # the extra one: 2


@pytest.mark.slow
def test_one_rank_skipping_gradient_sync_hangs_the_job_until_gloos_timeout(stock):
    """Rank 0 waits first (in the reduce-scatter rank 1 skipped), so its timeout fires first;
    rank 1 then times out too or sees the connection closed: a race, not asserted."""
    out = stock["no-sync-one-rank"]
    assert out["kind"] == "hang-timeout" and out["step"] == 2, out
    assert "Timed out waiting 10000ms for recv" in out["per_rank"]["0"] and 0 in out["ranks"]
    assert any(s in out["per_rank"]["1"] for s in ("Timed out waiting 10000ms", "by peer"))


@pytest.mark.slow
def test_a_mixed_precision_policy_differing_on_one_rank_kills_it_at_the_first_all_gather(stock):
    out = stock["mixed-precision-differs"]
    assert out["kind"] == "crash" and out["ranks"] == [1] and out["step"] == 0, out
    assert "SIGABRT" in out["per_rank"]["1"] and SIZE_MISMATCH in out["per_rank"]["1"]
    assert _saw_its_peer_die(out["per_rank"]["0"])


@pytest.mark.slow
def test_a_parameter_unused_on_one_rank_kills_that_rank_at_the_reduce_scatter():
    out = run_job(Job(("unused-param-one-rank",)))["unused-param-one-rank"]
    assert out["kind"] == "crash" and out["ranks"] == [1] and out["step"] == 2, out
    assert "SIGABRT" in out["per_rank"]["1"] and SIZE_MISMATCH in out["per_rank"]["1"]


@pytest.mark.slow
def test_a_job_past_its_deadline_is_stopped_with_its_ranks_and_reported_as_a_hang(tmp_path):
    job = Job(("no-sync-one-rank",), timeout_s=90, deadline_s=50)  # gloo would wait 90 s
    out = run_job(job, tmp_path)["no-sync-one-rank"]
    assert out["kind"] == "hang-timeout" and out["ranks"] == [0, 1], out
    assert all("killed by the launcher" in v or "SIGTERM" in v for v in out["per_rank"].values())
    assert len(list((tmp_path / "results").glob("rank*.pid"))) == 2  # the ranks had started
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []


# --- 4 ranks: 1-D FSDP and HSDP (2 x 2) -------------------------------------------------------

def _four_ranks(mesh: Mesh) -> dict[str, dict]:
    out = run_job(Job(("none", *SILENT, "extra-backward-one-rank"), world_size=4, mesh=mesh,
                      timeout_s=10))
    for name in ("no-sync-one-rank", "unused-param-one-rank", "mixed-precision-differs"):
        out.update(run_job(Job((name,), world_size=4, mesh=mesh, timeout_s=10)))
    return out


def test_a_bad_job_is_refused_in_one_line_before_any_process_starts():
    for bad in (dict(patterns=("nope",)), dict(patterns=("none",), world_size=1),
                dict(patterns=("none",), world_size=3, mesh=Mesh.HSDP),
                dict(patterns=("none",), timeout_s=0)):
        with pytest.raises(BadInput):
            Job(**bad)


# Stock FSDP2 at 4 ranks, measured: (kind, the ranks it names) per pattern; None: not asserted
# (which of several aborting ranks dies before torchrun ends the rest, and which waiting ranks
# time out before they see a timed-out peer close its connections, are races).
FOUR_RANKS_FSDP = {
    "none": ("no-effect", []), "optimizer-before-shard": ("silent-corruption", []),
    "clip-local-norm": ("silent-corruption", []), "load-one-rank": ("silent-corruption", []),
    "lr-one-rank": ("silent-corruption", []), "extra-backward-one-rank": ("crash", None),
    "no-sync-one-rank": ("hang-timeout", None),
    "unused-param-one-rank": ("crash", None), "mixed-precision-differs": ("crash", None),
}
# HSDP: replicas exist, so a one-rank drift shows as replicas that differ; a hang waits on a
# mesh subgroup, whose timeout is gloo's default (30 min), not init_process_group's: the
# script's own watchdog ends it.
FOUR_RANKS_HSDP = {
    **FOUR_RANKS_FSDP,
    "extra-backward-one-rank": ("hang-timeout", None), "no-sync-one-rank": ("hang-timeout", None),
}
REPLICAS_DIFFER_UNDER_HSDP = ("load-one-rank", "lr-one-rank")


@pytest.fixture(scope="module")
def four_fsdp():
    return _four_ranks(Mesh.FSDP)


@pytest.fixture(scope="module")
def four_hsdp():
    return _four_ranks(Mesh.HSDP)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(FOUR_RANKS_FSDP))
def test_stock_fsdp2_on_four_ranks(four_fsdp, name):
    kind, ranks = FOUR_RANKS_FSDP[name]
    out = four_fsdp[name]
    assert out["kind"] == kind, out
    if ranks is not None:
        assert out["ranks"] == ranks, out
    if kind == "crash":
        assert any(SIZE_MISMATCH in v for v in out["per_rank"].values()), out


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(FOUR_RANKS_HSDP))
def test_stock_hsdp_on_a_two_by_two_mesh(four_hsdp, name):
    kind, ranks = FOUR_RANKS_HSDP[name]
    out = four_hsdp[name]
    assert out["kind"] == kind, out
    if ranks is not None:
        assert out["ranks"] == ranks, out
    if name in REPLICAS_DIFFER_UNDER_HSDP:
        assert out["detail"] == "replicas differ after gathering full tensors", out


# --- the hardened column: harden(model) right after fully_shard, 2 ranks -----------------------
# Measured (kind, ranks, the error it names or None); a detection stops every rank at the named
# step, before the optimizer applies it, and leaves the process group intact.
HARDENED = {
    "none": ("no-effect", [], None),
    "optimizer-before-shard": ("detected", [0, 1], "OptimizerMismatch at step 0"),
    # two ranks that disagree and no majority: both are suspects (sync/evidence/vote.py)
    "extra-backward-one-rank": ("detected", [0, 1], "ClockMismatch at step 2"),
    "lr-one-rank": ("detected", [0, 1], "OptimizerMismatch at step 2"),
    "mixed-precision-differs": ("detected", [0, 1], "ParameterMismatch at ranks [0, 1]"),
    "clip-local-norm": ("detected", [0, 1], "ScaleMismatch at step 2"),  # each its own factor
    "load-one-rank": ("detected", [0], "CheckpointMismatch at step 0"),  # the rank that loaded
    # both diverge inside FSDP2's backward collectives; the ranks whose collective gloo fails
    # name rank 1 from the note it left in the store (sync/fsdp/last_words.py): under no-sync
    # both ranks time out and name it; without the gradient rank 1 is aborted by gloo and rank
    # 0 names it — unless torchrun ends rank 0 first (tests/test_fsdp_last_words.py)
    "no-sync-one-rank": ("detected", [1], "GradientsNotAveraged at step 2"),
    "unused-param-one-rank": ("detected", [1], "MissingGradient at step 2"),
}
ABORTED_BY_GLOO = ("unused-param-one-rank",)  # rank 1


@pytest.fixture(scope="module")
def hardened():
    """The corpus under harden() in three jobs, two at a time (~50 s on 2 shared cores)."""
    column = Column.HARDENED
    jobs = (Job(("none", "optimizer-before-shard", "extra-backward-one-rank", "lr-one-rank",
                 "clip-local-norm", "load-one-rank", "mixed-precision-differs"), column=column),
            Job(("no-sync-one-rank",), column=column, timeout_s=10),
            Job(("unused-param-one-rank",), column=column))
    with ThreadPoolExecutor(2) as pool:
        return {k: v for out in pool.map(run_job, jobs) for k, v in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HARDENED))
def test_hardened_fsdp2_on_two_ranks(hardened, name):
    kind, ranks, named = HARDENED[name]
    out = hardened[name]
    if name in ABORTED_BY_GLOO and out["per_rank"]["0"] != "detected":  # torchrun ended it
        kind, named = "crash", None
    assert out["column"] == "hardened" and out["kind"] == kind, out
    if ranks is not None:
        assert out["ranks"] == ranks, out
    if named is not None:
        assert out["detail"].startswith(named), out
        ended = [1] if name in ABORTED_BY_GLOO else []
        assert [r for r, v in out["per_rank"].items() if v != "detected"] == \
            [str(r) for r in ended] and out["failed_ranks"] == ended, out


# HSDP (2 x 2), 4 ranks: the load count names rank 0, the one that loaded, before the replica
# digest (which would name it and its replica, rank 2: a tie of two replicas names both).
# Under local-norm clipping the replicas of a shard agree, the two shard pairs do not: a tie,
# every rank named.
HARDENED_HSDP = {
    **{k: v for k, v in HARDENED.items() if k in ("none", "load-one-rank")},
    # one rank of four: the outlier of a strict majority
    "extra-backward-one-rank": ("detected", [1], "ClockMismatch at step 2"),
    "lr-one-rank": ("detected", [1], "OptimizerMismatch at step 2"),
    "mixed-precision-differs": ("detected", [1], "ParameterMismatch at ranks [1]"),
    "optimizer-before-shard": ("detected", [0, 1, 2, 3], "OptimizerMismatch at step 0"),
    "clip-local-norm": ("detected", [0, 1, 2, 3], "ScaleMismatch at step 2"),
}


@pytest.mark.slow
def test_hardened_hsdp_on_a_two_by_two_mesh():
    out = run_job(Job(tuple(HARDENED_HSDP), world_size=4, mesh=Mesh.HSDP,
                      column=Column.HARDENED, timeout_s=10, deadline_s=400))
    for name, (kind, ranks, named) in HARDENED_HSDP.items():
        assert out[name]["kind"] == kind and out[name]["ranks"] == ranks, out[name]
        assert named is None or out[name]["detail"].startswith(named), out[name]


# in CI (issue 41's done-when): ~30 s on 4 ranks (the clean reference run, then the pattern)
def test_hardened_hsdp_with_sync_off_on_one_rank_ends_at_the_watchdog_deadline_naming_it(
        tmp_path):
    """HSDP's collectives run on mesh subgroups, whose timeout is gloo's 30-minute default
    whatever the process group's (300 s here): the watchdog, watching FSDP2's reduce-scatter,
    reads rank 1's no-sync note once it has waited its 5 s deadline and ends rank 0 with it;
    the peers end at once after (measured: rank 0's result 5.8 s after it entered step 2)."""
    job = Job(("no-sync-one-rank",), world_size=4, mesh=Mesh.HSDP, column=Column.HARDENED,
              timeout_s=300, deadline_s=200, watchdog_s=5)
    out = run_job(job, tmp_path)["no-sync-one-rank"]
    assert out["kind"] == "detected" and out["ranks"] == [1] and out["step"] == 2, out
    assert out["detail"].startswith("GradientsNotAveraged at step 2, ranks [1]"), out
    results = tmp_path / "results"
    hung_s = ((results / "no-sync-one-rank.rank0.json").stat().st_mtime
              - (results / "no-sync-one-rank.rank0.step").stat().st_mtime)
    assert hung_s < 3 * job.watchdog_s, hung_s  # not gloo's 1800 s, not the job's deadline
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []
