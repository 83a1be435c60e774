"""How a measured effect becomes a verdict: thresholds, repeats, fair world sizes, commands.

Timing and skew are judged only at world sizes the recorded machine runs without sharing a
device (ranks ≤ cores on gloo, ≤ GPUs on NCCL; :func:`size_to_judge`), from at least
``MIN_REPEATS`` interleaved repeats, with a seeded bootstrap interval on the ratio
(:func:`judge_ratio`). Every *not measurable here* names the hardware and the command that
measures it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_ref.core.metrics import bootstrap_ratio
from openclaw_ref.reporting.claims.registry import Finding, Verdict
from openclaw_ref.reporting.record import RunRecord

MIN_REPEATS = 5

CMD_REPEATS = f"openclaw-bench compare --repeats {MIN_REPEATS}"
CMD_NCCL8 = f"openclaw-bench compare --backend nccl --world-sizes 1,2,4,8 --repeats {MIN_REPEATS}"
CMD_NCCL4 = f"openclaw-bench compare --backend nccl --world-sizes 1,4 --repeats {MIN_REPEATS}"
# Each finding's command writes the raw.json its verdict is read from (a compare run), or is
# NOTHING when no run here can change the verdict (a setting, a question, an undefined figure,
# or a figure no experiment of this suite records).


def cmd_sections(*names: str) -> str:
    """The compare run that records only ``names`` (each a compare section)."""
    return f"openclaw-bench compare --sections {','.join(names)}"


CMD_FAULTS = cmd_sections("faults")
CMD_OVERFLOW = cmd_sections("overflow")
CMD_LIGHTNING = cmd_sections("lightning")
CMD_ONE_GPU_PRECISION = "openclaw-bench compare --backend nccl --world-sizes 1 --sections precision"
NOTHING = ""
HW_8GPU = "8 GPUs with NCCL (text 000's 8×A100)"
HW_4GPU = "4 GPUs with NCCL (text 004's devices=4)"


def half_effect(seed_ratio: float) -> float:
    """The threshold for a claimed ratio: half its distance from 1 (3.2× → 2.1×)."""
    return 1 + (seed_ratio - 1) / 2


def cmd_cores(ranks: int) -> str:
    """The command that measures a timing claim at ``ranks`` gloo ranks (on ≥ ranks cores)."""
    sizes = ",".join(map(str, sorted({1, 2, ranks})))
    return f"openclaw-bench compare --backend gloo --world-sizes {sizes} --repeats {MIN_REPEATS}"


@dataclass(frozen=True)
class Needs:
    """Where a timing claim is measurable when this host is too small: hardware and command."""

    hardware: str
    command: str


def size_to_judge(rec: RunRecord, sizes: Sequence[int], ran: str, needs: Needs,
                  measured: str = "") -> int | Finding:
    """The largest of ``sizes`` (multi-rank sizes) whose ranks each get their own core (GPU
    under NCCL), or, when every one oversubscribes the host, the 'not measurable here' finding
    (showing ``measured``, else the sizes against the host's capacity)."""
    env = rec.environment
    fit = [w for w in sizes if w <= env.capacity]
    if fit:
        return max(fit)
    device = "GPUs" if env.backend == "nccl" else "cores"
    return Finding(Verdict.NOT_MEASURABLE, ran, measured or f"runs at {list(sizes)} ranks, host "
                   f"has {env.capacity} {device}: ranks time-share, so timing reflects the host",
                   f"needs {needs.hardware}; ranks ≤ {device}", needs.command)


def judge_ratio(num: Sequence[float], den: Sequence[float], threshold: float, what: str,
                command: str = CMD_REPEATS) -> tuple[Verdict, str, str]:
    """(label, reason, text) for 'ratio num/den ≥ threshold', judged by a bootstrap interval.

    Invariant: fewer than MIN_REPEATS pairs never produce a judged verdict."""
    if len(num) < MIN_REPEATS:
        reason = f"insufficient repeats: {len(num)} < {MIN_REPEATS}; run `{command}`"
        return Verdict.NOT_MEASURABLE, reason, f"{what}: {len(num)} paired repeats"
    iv = bootstrap_ratio(num, den)
    text = (f"{what} {iv.point:.3f} (95% bootstrap interval {iv.low:.3f}–{iv.high:.3f}, "
            f"{iv.n} interleaved repeats; threshold {threshold:.3f})")
    if iv.low > threshold:
        return Verdict.REPRODUCED, "", text
    if iv.high < threshold:
        return Verdict.NOT_REPRODUCED, "", text
    return Verdict.INSIDE_NOISE, "interval contains the threshold", text
