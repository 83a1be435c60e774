"""The table every comparison section renders and the cell formats they share: a captioned
``Table`` (rendered as GitHub markdown), fixed decimals, a ratio with its interval.

Why a module of its own: ``section_tables`` assembles the sections' tables, some of which live
in modules of their own (``corpus_tables``, ``false_alarm_tables``, ``fsdp_tables``,
``control_counts_tables``); here, below all of them, none imports the assembly back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from tabulate import tabulate

Figures = Mapping[str, Any]


class Table(NamedTuple):
    caption: str
    headers: list[str]
    rows: list[list[Any]]

    def markdown(self) -> str:
        return (f"**{self.caption}**\n\n"
                + tabulate(self.rows, headers=self.headers, tablefmt="github",
                           disable_numparse=True))


def replace_block(page: str, begin: str, end: str, body: str) -> str:
    """``page`` with the text between the markers ``begin`` and ``end`` replaced by ``body``:
    a rendered table kept inside a hand-written page (never typed there)."""
    start, stop = page.index(begin) + len(begin), page.index(end)
    return f"{page[:start]}\n{body.rstrip()}\n{page[stop:]}"


def fixed(x: float, digits: int, sign: bool = False) -> str:
    """``x`` to ``digits`` decimals (with its sign when ``sign``), as Python formats a float."""
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def yes(flag: Any, no: str = "no") -> str:
    return "yes" if flag else no


def interval(p: float, lo: float, hi: float, digits: int = 3) -> str:
    return f"{fixed(p, digits)} [{fixed(lo, digits)}, {fixed(hi, digits)}]"


INSIDE_NOISE = "inside the noise here"


def ratio_cell(p: float, lo: float, hi: float) -> str:
    """A ratio with its 95 % interval, and *inside the noise here* when the interval holds 1."""
    return interval(p, lo, hi) + (f" {INSIDE_NOISE}" if lo <= 1.0 <= hi else "")
