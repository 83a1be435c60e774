"""The record of a run that stops (``core/stop_record.py``): each rank's part merged into one
file, every event once; a part written once; a SIGTERM — while the main thread is blocked where
no Python handler runs — writes the part before the process ends with 143."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from openclaw_ref.core.jsonio import read_json
from openclaw_ref.core.stop_record import EXIT_SIGTERM, StopRecord, part_path
from openclaw_ref.sync.errors import NonFiniteGradient
from tests.helpers import ROOT

HEAD = {"config": {"steps": 3}, "environment": {"backend": "gloo"}}
NAN = NonFiniteGradient("local gradients held NaN/inf before the wire", step=1, ranks=[1])


def _rank(out, rank: int, losses: list[float]) -> StopRecord:
    return StopRecord(out, rank, lambda: HEAD,
                      lambda: {"loss": losses, "step_ms": [10.0] * len(losses), "events": []})


def test_the_parts_of_the_ranks_that_stopped_merge_into_one_record_each_event_once(tmp_path):
    out = tmp_path / "run.json"
    _rank(out, 1, [2.0, 1.5]).stopped(NAN)
    _rank(out, 0, [2.1]).stopped(NAN)
    record = read_json(out)
    assert record["config"] == HEAD["config"] and record["summary"]["stopped"]
    assert record["summary"]["ranks_reporting"] == [0, 1]
    assert record["summary"]["completed_steps"] == {"0": 1, "1": 2}
    assert record["steps"] == [{"step": 0, "rank_loss": [2.1, 2.0], "rank_step_ms": [10.0, 10.0]},
                               {"step": 1, "rank_loss": [None, 1.5],
                                "rank_step_ms": [None, 10.0]}]
    assert [(e["kind"], e["step"], e["ranks"]) for e in record["events"]] == \
        [("NonFiniteGradient", 1, [1])]
    assert record["summary"]["stopped_by"]["0"].startswith("NonFiniteGradient at step 1")


def test_a_rank_writes_its_part_once_whatever_stops_it_after(tmp_path):
    out = tmp_path / "run.json"
    rank = _rank(out, 0, [2.0])
    rank.stopped(NAN)
    rank.stopped("SIGTERM: ended from outside")
    assert read_json(part_path(out, 0))["reason"].startswith("NonFiniteGradient")


SLEEPER = textwrap.dedent("""
    import sys, time
    from openclaw_ref.core.stop_record import StopRecord
    record = StopRecord(sys.argv[1], 3, lambda: {"config": {}},
                        lambda: {"loss": [1.0], "step_ms": [5.0], "events": []})
    with record.on_sigterm():
        print("armed", flush=True)
        time.sleep(600)
""")


def test_a_sigterm_while_the_main_thread_is_blocked_writes_the_part_then_ends_143(tmp_path):
    out = tmp_path / "run.json"
    child = subprocess.Popen([sys.executable, "-c", SLEEPER, str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "armed"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == EXIT_SIGTERM
    finally:
        child.kill()
    part = read_json(part_path(out, 3))
    assert part["reason"].startswith("SIGTERM") and part["loss"] == [1.0]
    assert read_json(out)["summary"]["ranks_reporting"] == [3]
