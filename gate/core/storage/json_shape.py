"""The shape of parsed JSON, measured without recursion, and values shown without it.

orjson parses up to 1024 levels of nesting, but Python's recursion stops near 1000 (a
walk, a comparison, a `repr`) and orjson writes at most 254: a value between those limits,
read from a hostile file or server, would crash gate far from where it came in. Readers
measure what they keep with `keys_and_depth` (a loop, not a recursion) and refuse anything
deeper than `MAX_JSON_DEPTH`; messages show a value with `shown` (cut at a few levels).
"""

from __future__ import annotations

import reprlib
from typing import Any

# No file or answer gate reads nests deeper than a handful of levels (a top-k list is 3
# inside its record; a header's `engine.hardware.cpu_flags` 3 inside the header).
MAX_JSON_DEPTH = 64

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxstring = 60
_SHOWN.maxother = 60


def keys_and_depth(value: Any) -> tuple[int, int]:
    """(how many keys the objects in `value` hold, all levels down; how many levels of
    lists and objects it nests: 0 for a scalar, 1 for `[]` or `{}`)."""
    keys = deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        kind = type(item)
        if kind is dict:
            keys += len(item)
            inner = item.values()
        elif kind is list:
            inner = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((v, level + 1) for v in inner if type(v) is dict or type(v) is list)
    return keys, deepest


def parse_cost(raw: bytes) -> int:
    """About what parsing `raw` takes in memory, in bytes, before parsing it: a list costs
    about 64 bytes, an object about 232, each further element (a comma) up to 32."""
    return 64 * raw.count(b"[") + 232 * raw.count(b"{") + 32 * raw.count(b",")


def shown(value: Any) -> str:
    """`repr(value)` for a message: nesting past 3 levels and long strings cut (`...`)."""
    return _SHOWN.repr(value)
