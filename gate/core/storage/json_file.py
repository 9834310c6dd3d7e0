"""A JSON document read from a file, bounded in size; every failure an InputError naming the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from gate.errors import InputError

# A gate report is a few MB at most; anything far larger is not one.
MAX_JSON_BYTES = 256 * 1024 * 1024


def read_json(path: str | os.PathLike[str], *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise InputError(f"{p}: {size} bytes: too large for a {what} (at most {max_bytes})")
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{p}: not JSON ({exc}); expected a {what}") from None
