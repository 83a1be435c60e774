"""When FSDP2's own collective fails, ``harden()``'s defaults say why (``sync/fsdp/
last_words.py``): a rank about to reduce-scatter less than its group's full gradient, or to run a
backward that reduces fewer FSDP groups than all, leaves a note in the store first; the rank whose
reduce-scatter or all-gather gloo fails reads the notes and names the rank lacking.

The judging runs on a real ``HashStore``; the two corpus mistakes it exists for run as plain
torchrun scripts on 2 gloo ranks (they break the process group, so not in the shared pools)."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from openclaw_ref.fsdp_corpus.launch import Job, run_job
from openclaw_ref.fsdp_corpus.patterns import Column
from openclaw_ref.sync.errors import GradientsNotAveraged, MissingGradient
from openclaw_ref.sync.fsdp.last_words import Clock, GroupPlan, LastWords
from tests.helpers import loopback_store

PLAN = GroupPlan("layers.1", 1_000 + 100 + 40 + 8, {"w": 1_000, "b": 100, "aux.w": 40,
                                                     "aux.b": 8})
GROUPS = 4  # FSDP groups a rank reduces with gradient sync on
STEP2 = Clock(2, 3, GROUPS)  # 2 optimizer steps, 3 backwards, every group reducing
SHORT = PLAN.full_numel - 48  # aux.w and aux.b without a gradient


def _ranks(world: int) -> list[LastWords]:
    """``world`` ranks' last words on one real store."""
    store = dist.HashStore()
    return [LastWords(store, "ns", r, list(range(world)), [PLAN], GROUPS) for r in range(world)]


def _short(rank: LastWords, clock: Clock = STEP2, numel: int = SHORT) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rank.before_reduce_scatter(0, numel, lambda: clock)


# --- the notes -------------------------------------------------------------------------------
def test_the_shortfall_names_the_fewest_parameters_that_fit_it():
    assert PLAN.fitting(100) == ["b"]
    assert PLAN.fitting(48) == ["aux.b", "aux.w"]
    assert PLAN.fitting(7) == sorted(PLAN.param_numel)  # nothing fits: every one


def test_a_full_step_writes_nothing():
    rank = _ranks(2)[0]
    rank.backward_started(STEP2)
    rank.before_reduce_scatter(0, PLAN.full_numel, lambda: STEP2)
    assert rank.written == {"short": 0, "nosync": 0}


def test_a_short_reduce_scatter_is_noted_and_warned_in_this_ranks_own_log():
    rank = _ranks(2)[1]
    with pytest.warns(RuntimeWarning, match="rank 1 reduce-scatters FSDP group 'layers.1' "
                                            "without a gradient for aux.b, aux.w"):
        rank.before_reduce_scatter(0, SHORT, lambda: STEP2)
    assert rank.written == {"short": 1, "nosync": 0}


def test_a_backward_with_sync_off_is_noted():
    rank = _ranks(2)[1]
    rank.backward_started(Clock(2, 3, 0))
    assert rank.written == {"short": 0, "nosync": 1} and rank.store.get("ns/nosync/1") == b"2.3.0"


def test_a_store_that_cannot_be_reached_neither_stops_training_nor_hides_gloos_error():
    """The store's host may be what failed: a note it refuses is skipped with one warning, and
    a diagnosis it cannot read is None (the wrapper then raises gloo's error as it was)."""
    server = loopback_store(2)
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=2))
    rank = LastWords(client, "ns", 1, [0, 1], [PLAN], GROUPS)
    del server
    with pytest.warns(RuntimeWarning, match="the store refused a note"):
        rank.backward_started(Clock(2, 3, 0))
    rank.backward_started(Clock(2, 4, 0))
    assert rank.unwritten == 2 and rank.written == {"short": 0, "nosync": 0}
    assert rank.diagnose(Clock(2, 4, 0)) is None


# --- the diagnosis ---------------------------------------------------------------------------
def test_the_rank_whose_input_is_short_is_named_with_the_parameters_it_lacks():
    r0, r1 = _ranks(2)
    _short(r1)
    error = r0.diagnose(STEP2, 0, PLAN.full_numel)
    assert isinstance(error, MissingGradient)
    assert error.ranks == [1] and error.params == ["aux.b", "aux.w"] and error.step == 2


def test_the_short_rank_names_itself_when_its_own_collective_fails():
    r0, r1 = _ranks(2)
    _short(r1)
    error = r1.diagnose(STEP2, 0, SHORT)
    assert isinstance(error, MissingGradient) and error.ranks == [1]


def test_of_two_ranks_the_short_one_is_named_also_when_it_is_rank_zero():
    r0, r1 = _ranks(2)
    _short(r0, numel=PLAN.full_numel - 100)
    error = r1.diagnose(STEP2, 0, PLAN.full_numel)
    assert isinstance(error, MissingGradient) and error.ranks == [0] and error.params == ["b"]


def test_a_parameter_unused_on_every_rank_is_not_a_cause():
    ranks = _ranks(4)
    for r in ranks:
        _short(r)
    assert ranks[0].diagnose(STEP2, 0, SHORT) is None


def test_a_note_from_an_earlier_backward_is_not_read_as_this_ones():
    r0, r1 = _ranks(2)
    _short(r1, clock=Clock(2, 2, GROUPS))
    r1.backward_started(Clock(2, 2, 0))
    assert r0.diagnose(STEP2, 0, PLAN.full_numel) is None


def test_the_rank_that_reduces_fewer_groups_is_named_by_each_failing_collective():
    r0, r1 = _ranks(2)
    r1.backward_started(Clock(2, 3, 0))
    from_reduce_scatter = r0.diagnose(STEP2, 0, PLAN.full_numel)
    from_all_gather = r1.diagnose(Clock(2, 3, 0))
    for error in (from_reduce_scatter, from_all_gather):
        assert isinstance(error, GradientsNotAveraged) and error.ranks == [1], error


def test_accumulation_on_every_rank_and_an_all_gather_without_notes_are_not_a_cause():
    ranks = _ranks(2)
    for r in ranks:
        r.backward_started(Clock(2, 3, 0))
    assert ranks[0].diagnose(Clock(2, 3, 0)) is None
    assert _ranks(2)[0].diagnose(STEP2) is None


# --- the corpus mistakes, harden()'s defaults, 2 gloo ranks -----------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The two mistakes that diverge inside FSDP2's backward, each its own torchrun job (each
    breaks its process group), run together (~30 s on 2 shared cores); logs kept."""
    dirs = [tmp_path_factory.mktemp(n) for n in ("unused", "nosync")]
    jobs = (Job(("unused-param-one-rank",), column=Column.HARDENED),
            Job(("no-sync-one-rank",), column=Column.HARDENED, timeout_s=5))
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(run_job, jobs, dirs))
    return {k: v for out in outs for k, v in out.items()}, dirs[0]


def _stderr(workdir: Path, rank: int) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in (workdir / "logs").glob(f"*/attempt_*/{rank}/stderr.log"))


def test_a_parameter_unused_on_one_rank_says_so_in_its_log_before_gloo_aborts_it(corpus):
    """Rank 1 warns, then gloo aborts it; rank 0 names it — unless torchrun, which checks its
    workers every 0.1 s, ends rank 0 first (then rank 0 wrote nothing: a race, not asserted)."""
    outcomes, workdir = corpus
    out, log = outcomes["unused-param-one-rank"], _stderr(workdir, 1)
    assert "rank 1 reduce-scatters FSDP group '<root>' without a gradient for aux.bias, " \
           "aux.weight" in log and "SIGABRT" in out["per_rank"]["1"], (out, log[-2000:])
    if out["per_rank"]["0"] == "detected":
        assert (out["kind"], out["error"], out["step"], out["ranks"]) == \
            ("detected", "MissingGradient", 2, [1]), out
        assert out["failed_ranks"] == [1] and out["failed_error"] == "SIGABRT", out
    else:
        assert out["kind"] == "crash" and out["ranks"] == [1], out


def test_gradient_sync_off_on_one_rank_is_named_by_both_ranks_at_the_timeout(corpus):
    """Rank 0 in its reduce-scatter, rank 1 in its all-gather: both time out and both read
    rank 1's note."""
    out = corpus[0]["no-sync-one-rank"]
    assert (out["kind"], out["error"], out["step"], out["ranks"]) == \
        ("detected", "GradientsNotAveraged", 2, [1]), out
    assert out["per_rank"] == {"0": "detected", "1": "detected"}, out
