"""Progress: what a workflow reports while it works, and the resumable progress file.

`Progress` is the small interface the CLI draws as a rich progress bar (`QUIET` draws
nothing). `ProgressLog` is the file behind `gate run --resume`: a trace v1 header first,
then one record a line for each finished prompt, each written, flushed and fsynced, so a
Ctrl-C, an engine crash or an out-of-memory kill loses at most the prompt in flight.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from gate.core.storage.atomic import PROGRESS, PROGRESS_KEY, file_kind
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, TraceHeader, encode_header, encode_record
from gate.errors import InputError

PROGRESS_SUFFIX = ".partial.jsonl"
# Header keys that differ between a run and its resumption (the marker: files written
# before it was added resume too).
_UNCOMPARED = frozenset({"created_at", PROGRESS_KEY})


class Progress(Protocol):
    """What a workflow reports while it works (the CLI draws it as a rich progress bar)."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class QuietProgress:
    """The progress of nobody watching."""

    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


QUIET: Progress = QuietProgress()


def default_progress_path(model: str, engine: str, shard: tuple[int, int] | None = None) -> Path:
    """`$GATE_RUNS_DIR` (else `./.gate/runs`) `/<model>/<engine>[.shard-K-of-N].partial.jsonl`."""
    root = Path(os.environ.get("GATE_RUNS_DIR") or Path(".gate") / "runs")
    safe_engine = "".join(c if c.isalnum() or c in "-_." else "_" for c in engine)
    tag = f".shard-{shard[0]}-of-{shard[1]}" if shard else ""
    return root.joinpath(*model.split("/")) / f"{safe_engine}{tag}{PROGRESS_SUFFIX}"


def check_progress_target(path: Path, model: str, engine: str | None = None) -> None:
    """Refuse (exit 2) to replace `path` unless it is a progress file of the same run (the
    same model, and engine where known): a progress file is replaced without --force, so
    any other file there (a trace, a pin, a report, a user's own) would be lost."""
    kind = file_kind(path)
    if kind is None:
        return
    if kind != PROGRESS:
        raise InputError(
            f"progress file {path}: is a {kind}, not a progress file; gate never replaces it, --force or not "
            "(name another --progress-file)"
        )
    try:
        with open(path, "rb") as fh:
            head = orjson.loads(fh.readline())
    except (OSError, orjson.JSONDecodeError):
        head = None
    engine_info = head.get("engine") if isinstance(head, dict) else None
    theirs = (
        head.get("model") if isinstance(head, dict) else None,
        engine_info.get("name") if isinstance(engine_info, dict) else None,
    )
    if theirs[0] != model or (engine is not None and theirs[1] != engine):
        raise InputError(
            f"progress file {path}: is the progress file of another run (model {theirs[0]!r}, engine "
            f"{theirs[1]!r}; this run: model {model!r}, engine {engine!r}); gate never replaces it (remove it "
            "or name another --progress-file)"
        )


def _comparable(header: TraceHeader) -> dict[str, Any]:
    return {k: v for k, v in header.to_dict().items() if k not in _UNCOMPARED}


class ProgressLog:
    """Append-only progress file: header first, then one fsynced record per finished prompt."""

    def __init__(self, path: Path, fh: IO[bytes]) -> None:
        self.path = path
        self._fh = fh

    @classmethod
    def start(cls, path: Path, header: TraceHeader) -> ProgressLog:
        """A new progress file (replacing an old one) holding only `header`.

        The old file is unlinked, never truncated: a run still writing it (two runs of one
        model and engine in one folder) goes on writing its own, now nameless, file and
        cannot interleave records with this one."""
        check_progress_target(path, header.model, str(header.engine.get("name")))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            fh = open(path, "xb")  # noqa: SIM115  # closed by close()
        except OSError as exc:
            raise InputError(f"progress file {path}: cannot write there: {exc.strerror or exc}") from None
        log = cls(path, fh)
        log._write(encode_header(replace(header, extra={**header.extra, PROGRESS_KEY: 1})))
        return log

    @classmethod
    def resume(cls, path: Path, header: TraceHeader) -> tuple[ProgressLog, list[PromptRecord]]:
        """Reopen `path` for appending; return it and the records it holds.

        The header must equal `header` (but for when it was written); a torn last line (no
        newline: the writer was killed mid-record) is cut off before appending."""
        if not path.is_file():
            raise InputError(
                f"--resume: no progress file {path}: nothing to resume (run without --resume to start, "
                "or pass --progress-file)"
            )
        kind = file_kind(path)
        if kind is not None and kind != PROGRESS:
            # Resuming cuts a torn last line off: never done to a file that is not a progress file.
            raise InputError(
                f"--resume: {path} is a {kind}, not a progress file; nothing to resume from it (it is left as it is)"
            )
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            raise InputError(f"--resume: progress file {path} has no complete header line: start afresh")
        if cut < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(cut)
                fh.flush()
                os.fsync(fh.fileno())
        done = read_trace(path, role="candidate")
        want, found = _comparable(header), _comparable(done.header)
        if want != found:
            diff = sorted(k for k in want.keys() | found.keys() if want.get(k) != found.get(k))
            key = diff[0]
            raise InputError(
                f"--resume: progress file {path} is from another run: header field {key!r} is {found.get(key)!r}, "
                f"this run's is {want.get(key)!r}; rerun without --resume to start afresh"
            )
        return cls(path, open(path, "ab")), list(done.records)

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def append(self, record: PromptRecord) -> None:
        self._write(encode_record(record))

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        """Close and delete the file, unless another run has since put its own in its place."""
        with contextlib.suppress(OSError, ValueError):  # ValueError: already closed
            if os.path.samestat(os.fstat(self._fh.fileno()), os.stat(self.path)):
                self.path.unlink()
        self.close()
