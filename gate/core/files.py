"""Where gate's data folders are (pins, goldens), and file digests for provenance."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The checkout gate runs from (an editable install): its oracle_pins/ and goldens/ hold the
# committed ones.
REPO_ROOT = Path(__file__).resolve().parents[2]
CHUNK = 1 << 20


def data_roots(dirname: str, env_var: str, given: Path | None = None, *, cwd: Path | None = None) -> list[Path]:
    """Where a data folder is looked for, in order: the folder given on the command line;
    else `$env_var`; else `./dirname` and the `dirname/` of the checkout gate runs from."""
    if given is not None:
        return [Path(given)]
    env = os.environ.get(env_var)
    if env:
        return [Path(env)]
    here = (cwd or Path.cwd()) / dirname
    roots = [here]
    repo = REPO_ROOT / dirname
    if repo.resolve() != here.resolve():
        roots.append(repo)
    return roots


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of one file, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
