"""Where gate's data folders are (pins, goldens, its cache), file digests for provenance,
and paths as a header records them: never the recording machine's folder layout."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The folder above the package: in a checkout (an editable install), the repository's root.
REPO_ROOT = Path(__file__).resolve().parents[3]
CHUNK = 1 << 20
# gate's own data folders (oracle_pins/, goldens/) have one home, the repository's top level;
# `gate/_data/<name>` is a symbolic link to it, which the wheel's build follows (setup.py), so
# one way finds them everywhere: importlib.resources, `gate/_data/<name>`. In a checkout that
# is the link, resolved to the top-level folder (written to by `gate pin record`); in a wheel,
# the package's own copy (never written to).
PACKAGE_DATA = "_data"
DATA_DIRS = ("oracle_pins", "goldens")


def own_data_dir(dirname: str) -> Path | None:
    """gate's own data folder `dirname` (`gate/_data/<dirname>`, a checkout's link followed),
    None when there is none (a package imported from a zip has no folder to walk)."""
    found = importlib.resources.files("gate").joinpath(PACKAGE_DATA, dirname)
    if not isinstance(found, Path) or not found.is_dir():
        return None
    return found.resolve() if found.is_symlink() else found


def _own_roots() -> list[Path]:
    """The folders gate's own data folders sit in, so a pin of gate's own is said
    `oracle_pins/...` from any folder: the one each link leads to (a checkout's root), then
    `gate/_data/` (an installed wheel's, whose folders are its own)."""
    roots = [found.parent for name in DATA_DIRS if (found := own_data_dir(name)) is not None]
    data = importlib.resources.files("gate").joinpath(PACKAGE_DATA)
    return list(dict.fromkeys([*roots, *([data] if isinstance(data, Path) else [])]))


def is_packaged(path: Path) -> bool:
    """True when `path` lies inside the installed package's data (never written to); a
    checkout's links lead out of it, to the top-level folders."""
    root = importlib.resources.files("gate").joinpath(PACKAGE_DATA)
    return isinstance(root, Path) and Path(path).resolve().is_relative_to(root.resolve())


def data_roots(dirname: str, env_var: str, given: Path | None = None, *, cwd: Path | None = None) -> list[Path]:
    """Where a data folder is looked for, in order: the folder given on the command line;
    else `$env_var`; else `./dirname`, then gate's own (`own_data_dir`: the installed
    package's data, or the checkout's)."""
    if given is not None:
        return [Path(given)]
    env = os.environ.get(env_var)
    if env:
        return [Path(env)]
    here = (cwd or Path.cwd()) / dirname
    roots = [here]
    own = own_data_dir(dirname)
    if own is not None and own.resolve() != here.resolve():
        roots.append(own)
    return roots


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of one file, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def gate_cache_dir() -> Path:
    """gate's cache root: $GATE_CACHE_DIR, else $XDG_CACHE_HOME/gate, else ~/.cache/gate."""
    explicit = os.environ.get("GATE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "gate"


# --------------------------------------------------------------------------- portable paths

# How a header says where a file lay, without the machine's folders (docs/reference/trace-format.md).
CACHE_MARK = "$GATE_CACHE"  # gate's cache folder (`gate_cache_dir()`)
HOME_MARK = "~"
ELIDED = "..."  # a folder elsewhere: only the file's own name is kept

# (folder, mark), most specific first: a path under the folder is said as `mark/rest`, or
# as `rest` alone where the mark is empty (relative to the working folder or checkout).
Places = Sequence[tuple[Path, str]]


def local_places(*, cwd: Path | None = None) -> tuple[tuple[Path, str], ...]:
    """The folders a path is said relative to on this machine: gate's cache, the working
    folder and gate's checkout (unless the home folder lies inside them: `/` or `/home`
    would keep the whole layout), then the home folder."""
    try:
        home: Path | None = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no password entry
        home = None
    places: list[tuple[Path, str]] = []
    with contextlib.suppress(RuntimeError, KeyError):  # no home folder to put it under
        places.append((gate_cache_dir(), CACHE_MARK))
    for base in (cwd if cwd is not None else _cwd(), *_own_roots()):
        if base is not None and (home is None or not _under(home, base)) and base.parent != base:
            places.append((base, ""))
    if home is not None and home.parent != home:
        places.append((home, HOME_MARK))
    return tuple(places)


def _cwd() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the working folder was removed
        return None


def _forms(path: Path) -> list[Path]:
    """The path as written (normalised) and as resolved (symbolic links followed)."""
    plain = Path(os.path.normpath(path))
    try:
        real = path.resolve()
    except (OSError, RuntimeError):
        return [plain]
    return [plain] if real == plain else [plain, real]


def _under(path: Path, base: Path) -> bool:
    return any(p.is_relative_to(b) for p in _forms(path) for b in _forms(base))


def portable_path(
    path: str | os.PathLike[str], places: Places | None = None, *, elide: bool = True, tail: int = 1
) -> str:
    """`path` as a header records it: `$GATE_CACHE/models/x` under gate's cache, relative
    under the working folder or gate's checkout, `~/x` under the home folder. A relative
    path is kept as given. Elsewhere the path is `.../name` (its last `tail` names only),
    or, with `elide=False` (a report for this machine's user), kept as it is."""
    text = os.fspath(path)
    if not text or not os.path.isabs(text):
        return text
    given = Path(text)
    for base, mark in local_places() if places is None else places:
        for p in _forms(given):
            for b in _forms(base):
                if p.is_relative_to(b):
                    rest = p.relative_to(b).as_posix()
                    if rest == ".":
                        return mark or "."
                    return f"{mark}/{rest}" if mark else rest
    if not elide:
        return text
    names = Path(os.path.normpath(given)).parts[1:][-max(1, tail) :]
    return "/".join((ELIDED, *names))


def portable(value: Any, places: Places | None = None) -> Any:
    """`value` (a header's engine info, options, ...) with every string that is an absolute
    path made portable (`portable_path`), at any depth of mappings and lists."""
    where = local_places() if places is None else places
    if isinstance(value, str):
        return portable_path(value, where) if os.path.isabs(value) and "\n" not in value else value
    if isinstance(value, Mapping):
        return {k: portable(v, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(portable(v, where) for v in value)
    return value


def display_path(path: str | os.PathLike[str], *, cwd: Path | None = None) -> str:
    """A path as a report shows it to this machine's user: as `portable_path`, but a path
    outside gate's cache, the working folder, the checkout and home is kept whole."""
    return portable_path(path, local_places(cwd=cwd), elide=False)
