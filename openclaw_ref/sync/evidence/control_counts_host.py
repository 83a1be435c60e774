"""The clean check of a small reduced step block on a CPU, in plain Python; and ``check_counts``,
the one entry point, which picks this path or the tensor path (``control_counts``) per block.

Why it exists: ``check_counts_tensor`` spends about 40 tensor operations on a step block, and on
a CPU each costs a few µs of dispatch whatever its size. A block of a few thousand elements (a
few buckets at a few ranks: B × (139 + 4·W) + 65 elements on fp32 up to 64 ranks) is checked
faster by reading it to the host once (``tolist``) and applying the same rules to floats.
``check_counts`` sends a CPU block here up to ``HOST_CHECK_MAX_ELEMENTS``, where the two
paths' costs cross; every other block stays on the tensor path. (It lives here, above both
paths, so that ``control_counts`` never imports this module back.)

Invariant: the same ``CountCheck`` and the same extra values as ``check_counts_tensor`` for
every block, bit for bit (NaN counts, joined ranks and replica rows included). The rules live
once, in ``control_counts``, each host form beside its tensor form; this module only walks the
block's layout. ``tests/test_control_counts_host.py`` proves the invariant by property test.
"""

from __future__ import annotations

import torch

from openclaw_ref.sync.evidence.control_counts import (
    COUNT_FIELDS,
    DETAIL_FIELDS,
    HIST_BINS,
    HOST_CHECK_MAX_ELEMENTS,
    JOINED,
    STEP_FIELDS,
    CountCheck,
    CountLayout,
    Figures,
    agrees,
    binned_figures,
    bucket_ok,
    check_counts_tensor,
    detail_figures,
    ready_ms,
    spread,
)


def group_sum(values: list[float], at: int, groups: int, width: int) -> list[float]:
    """The element-wise sum of ``groups`` consecutive runs of ``width`` values from ``at`` (the
    tensor path's ``view(groups, width).sum(0)``: the counts are integers, exact in any order)."""
    total = values[at:at + width]
    for _ in range(1, groups):
        at += width
        total = [a + b for a, b in zip(total, values[at:at + width])]
    return total


def check_counts_host(block: torch.Tensor, layout: CountLayout, buckets: int,
                      extra: torch.Tensor | None = None) -> tuple[CountCheck, list[float]]:
    """``check_counts`` on the host: ``block`` read once, the rules applied to
    its floats; ``extra`` read as float64 values."""
    values = block.tolist()  # the one host read of the block
    B, G, W, row, detail = (buckets, layout.groups, layout.world_size, layout.row,
                            layout.detail)
    ready_at, ready_end = G * COUNT_FIELDS, G * COUNT_FIELDS + DETAIL_FIELDS * W
    counts: list[list[float]] = []
    figures: list[Figures | None] = []
    for at in range(0, B * row, row):
        c = group_sum(values, at, G, COUNT_FIELDS)
        counts.append(c)
        if not bucket_ok(c, W):
            figures.append(None)
        elif detail:
            d = values[at + ready_at:at + ready_end]
            marks = d[0::DETAIL_FIELDS]
            ms = list(map(ready_ms, d[1::DETAIL_FIELDS], d[2::DETAIL_FIELDS],
                          d[3::DETAIL_FIELDS]))
            figures.append(detail_figures(marks, ms, *spread(marks, ms), c[JOINED]))
        else:
            figures.append(binned_figures(group_sum(values, at + ready_at, G, HIST_BINS),
                                          c[JOINED] > 0))
    step = group_sum(values, B * row, G, STEP_FIELDS)
    rep_ok = agrees(step[1:], step[0])
    oks = [f is not None for f in figures]
    failed = not all(oks) or not rep_ok
    check = CountCheck(oks, figures, rep_ok, any(c[JOINED] > 0 for c in counts),
                       counts if failed else [], step if not rep_ok else [])
    return check, [] if extra is None else [float(v) for v in extra.reshape(-1).tolist()]


def check_counts(block: torch.Tensor, layout: CountLayout, buckets: int,
                 extra: torch.Tensor | None = None) -> tuple[CountCheck, list[float]]:
    """The clean check of a reduced step block, one host transfer (``extra``, any 1-D tensor
    the caller needs on the host too, rides along): a CPU block of at most
    ``HOST_CHECK_MAX_ELEMENTS`` is read to the host and checked in Python
    (``check_counts_host``: a few dozen tensor operations cost more there than the
    arithmetic), any other on its own device (``check_counts_tensor``). Same answer."""
    if block.is_cpu and block.numel() <= HOST_CHECK_MAX_ELEMENTS:
        return check_counts_host(block, layout, buckets, extra)
    return check_counts_tensor(block, layout, buckets, extra)
