"""Text from input files, made safe to show a person: one helper for every human report.

Prompt ids, token texts, model names and paths come from files anyone can write. Shown
raw, an ANSI escape can recolour or erase a CI log's verdict line, a carriage return or
newline can forge one, and a bidi override (U+202E) can reorder what a reader sees.
`printable` writes every such character as a visible escape (`\\u001b`, `\\u202e`; `\\n`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# C0 controls (newline and tab included), DEL, C1 controls; the Unicode characters that
# reorder or hide text: the Arabic letter mark, zero-width and directional marks, line and
# paragraph separators, bidi embeddings, overrides and isolates, word joiners and invisible
# operators, the byte order mark, interlinear annotation controls.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _SHORT:
        return _SHORT[ch]
    return f"\\u{ord(ch):04x}"  # as JSON writes it, so quoted token texts read alike


def printable(text: str) -> str:
    """`text` with every control, bidi or invisible formatting character escaped."""
    return _UNSAFE.sub(_escape, text)


def plural(n: int, one: str, many: str | None = None) -> str:
    """`1 prompt`, `2 prompts`, `0 exact ties`: a count with its noun in the right number
    (`many` defaults to `one` + "s")."""
    return f"{n} {one if n == 1 else (many if many is not None else one + 's')}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` Did you mean 'x'?` naming the one of `known` closest to `name` (as `difflib`
    finds it), or "" when none is close: the tail of an "unknown NAME" message."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
