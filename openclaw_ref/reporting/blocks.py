"""Rendered blocks inside hand-written pages: the text between ``<!-- NAME: … -->`` and
``<!-- /NAME -->`` is a renderer's output, never typed — the README's cost line (from the
published record), the gate's line and error-rate table (from its calibration).

Why markers rather than whole generated pages: the README and docs are prose a person writes;
only their figures must come from a record. Each renderer owns one named block, rewrites it
from its record, and a test holds the committed page to the committed record.
"""

from __future__ import annotations

import re
from pathlib import Path

from openclaw_ref.core.jsonio import write_text_atomic


def begin(name: str, source: str) -> str:
    """The opening marker of block ``name``, saying where its text comes from."""
    return f"<!-- {name}: rendered from {source}, do not edit -->"


def end(name: str) -> str:
    return f"<!-- /{name} -->"


def _span(page: str, name: str) -> tuple[int, int]:
    """(start, end) of block ``name``'s body in ``page``; ``KeyError`` if it has none."""
    opening = re.search(rf"<!-- {re.escape(name)}: [^\n]*? -->", page)
    closing = page.find(end(name))
    if opening is None or closing < opening.end():
        raise KeyError(f"no block {name!r} on this page")
    return opening.end(), closing


def block_of(page: str, name: str) -> str:
    """The body of block ``name`` (stripped)."""
    start, stop = _span(page, name)
    return page[start:stop].strip()


def with_block(page: str, name: str, body: str) -> str:
    """``page`` with block ``name``'s body replaced by ``body``; a body that is one line stays
    inline (``<!-- x: … -->body<!-- /x -->``) so a sentence can hold a block."""
    start, stop = _span(page, name)
    if "\n" in body.strip() or "\n" in page[start:stop]:
        return f"{page[:start]}\n{body.strip()}\n{page[stop:]}"
    return f"{page[:start]}{body.strip()}{page[stop:]}"


def rewrite(path: Path, name: str, body: str) -> Path:
    """Rewrite block ``name`` of the page at ``path`` (atomically)."""
    text = path.read_text(encoding="utf-8")
    return write_text_atomic(path, with_block(text, name, body))
