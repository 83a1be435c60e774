"""``tox -e gpu``'s table (``.ci/gpu_table.py``): each test's outcome as pytest reported it."""

from __future__ import annotations

import importlib.util

from tests.helpers import ROOT

SPEC = importlib.util.spec_from_file_location("gpu_table", ROOT / ".ci" / "gpu_table.py")
gpu_table = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_table)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_gpu" name="test_ok" time="1.0"/>
<testcase classname="tests.test_gpu" name="test_two"><skipped type="pytest.skip"
 message="needs 2 CUDA GPUs (NCCL, one per rank)">x</skipped></testcase>
<testcase classname="tests.test_gpu" name="test_bad"><failure
 message="assert 0.1 &lt;= 1e-06&#10;second line">tb</failure></testcase>
</testsuite></testsuites>"""


def test_the_table_gives_each_test_its_outcome_and_first_reason_line(tmp_path):
    xml = tmp_path / "gpu.xml"
    xml.write_text(JUNIT)
    assert gpu_table.outcomes(str(xml)) == [
        ("test_gpu::test_ok", "passed", ""),
        ("test_gpu::test_two", "skipped", "needs 2 CUDA GPUs (NCCL, one per rank)"),
        ("test_gpu::test_bad", "failed", "assert 0.1 <= 1e-06")]


def test_the_table_header_counts_the_outcomes_and_names_the_device():
    text = gpu_table.table([("a", "passed", ""), ("b", "failed", "x")], "1 × NVIDIA H200")
    assert text.startswith("`pytest -m gpu` on 1 × NVIDIA H200: 1 passed, 0 skipped, 1 failed")
    assert "| b | failed | x |" in text


def test_only_a_run_where_every_test_passed_clears():
    ok, skip, bad = ("a", "passed", ""), ("b", "skipped", "needs a CUDA GPU"), ("c", "failed", "")
    assert gpu_table.verdict([ok, ok]) == "CLEARED: all 2 passed"
    assert gpu_table.verdict([ok, skip]) == "UNDECIDED: 1 of 2 skipped"
    assert gpu_table.verdict([]).startswith("UNDECIDED")
    assert gpu_table.verdict([ok, skip, bad]) == "NOT CLEARED: failed c"
