"""Print the outcome of ``pytest -m gpu`` as a table: test → passed/skipped/failed, with the
device it ran on. Reads the JUnit XML pytest wrote (``--junitxml``); ``tox -e gpu`` runs it
after the tests and also writes the table to the path given second (to commit it).

    python .ci/gpu_table.py <junit.xml> [<table.md>] [--verdict]

``--verdict`` (``.ci/gpu-canary``) adds one line after the table: CLEARED when every test passed,
NOT CLEARED naming the failed ones, UNDECIDED when any skipped (or none ran).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(junit_xml: str) -> list[tuple[str, str, str]]:
    """(test, outcome, reason) per test case, in the order pytest ran them."""
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                reason = (found.get("message") or "").splitlines()[0][:90] if found.get(
                    "message") else ""
                break
        rows.append((name, outcome, reason))
    return rows


def device_name() -> str:
    try:
        import torch
    except ImportError:
        return "torch not importable"
    if not torch.cuda.is_available():
        return "no CUDA device"
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return f"{torch.cuda.device_count()} × {', '.join(names)} (torch {torch.__version__}, " \
           f"CUDA {torch.version.cuda})"


def table(rows: list[tuple[str, str, str]], device: str) -> str:
    counts = {k: sum(1 for _, o, _ in rows if o == k) for k in ("passed", "skipped", "failed")}
    lines = [f"`pytest -m gpu` on {device}: " + ", ".join(f"{v} {k}" for k, v in counts.items()),
             "", "| test | outcome | reason |", "|---|---|---|"]
    lines += [f"| {name} | {outcome} | {reason.replace('|', '/')} |" for name, outcome, reason
              in rows]
    return "\n".join(lines) + "\n"


def verdict(rows: list[tuple[str, str, str]]) -> str:
    """What a run of evidence tests decides: only a run where every test passed clears."""
    failed = [name for name, outcome, _ in rows if outcome == "failed"]
    skipped = [name for name, outcome, _ in rows if outcome == "skipped"]
    if failed:
        return "NOT CLEARED: failed " + ", ".join(failed)
    if skipped or not rows:
        return f"UNDECIDED: {len(skipped)} of {len(rows)} skipped"
    return f"CLEARED: all {len(rows)} passed"


def main(argv: list[str]) -> int:
    paths = [a for a in argv if a != "--verdict"]
    rows = outcomes(paths[0])
    text = table(rows, device_name())
    print(text)
    if len(paths) > 1:
        Path(paths[1]).write_text(text)
    if "--verdict" in argv:
        print(verdict(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
