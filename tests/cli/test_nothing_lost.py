"""Nothing is lost: no command writes over a file it reads or over a file of another kind,
--force or not; --force replaces only a file of the kind the command writes; a progress
file is only replaced when it is a progress file of the same run.

Each writer is tried against: one of its inputs (the pin), a file of every other kind, and
a file of its own kind, with and without --force."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake

from gate.core.storage.atomic import (
    GOLDEN,
    PIN,
    PROGRESS,
    REPORT,
    SETTINGS,
    SUITE,
    TRACE,
    atomic_write,
    file_kind,
)
from gate.errors import InputError


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A toy pin, and one file of each kind gate writes (none of them an input)."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        register_fake(mp)
        pins = root / "pins"
        folder = record_toy_pin(pins)
        trace = root / "kinds" / "trace.jsonl"
        r = invoke(
            ["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake", "--save-trace", str(trace)]
        )
        assert r.exit_code == 0, r.output
        golden = root / "kinds" / "golden.jsonl"
        r = invoke(
            [
                "goldens",
                "record",
                "--model",
                TOY_MODEL,
                "--pins-dir",
                str(pins),
                "--engine",
                "fake",
                "--golden",
                str(golden),
            ]
        )
        assert r.exit_code == 0, r.output
    first, rest = trace.read_bytes().split(b"\n", 1)
    progress = root / "kinds" / "progress.jsonl"
    progress.write_bytes(orjson.dumps({**orjson.loads(first), "gate_progress": 1}) + b"\n" + rest)
    report = root / "kinds" / "report.md"
    report.write_text("# my own notes\n", encoding="utf-8")
    other_pin = root / "kinds" / "pin.jsonl"
    other_pin.write_bytes((folder / "pin.jsonl").read_bytes())
    yield {
        "pins": pins,
        "pin": folder / "pin.jsonl",
        TRACE: trace,
        GOLDEN: golden,
        PROGRESS: progress,
        REPORT: report,
        PIN: other_pin,
        SUITE: folder / "suite.jsonl",
        SETTINGS: folder / "oracle.json",
    }


def test_every_kind_is_told_apart(world: dict[str, Path]) -> None:
    for kind in (TRACE, GOLDEN, PROGRESS, REPORT, PIN, SUITE, SETTINGS):
        assert file_kind(world[kind]) == kind, kind
    assert file_kind(world["pin"]) == PIN
    assert file_kind(world["pins"] / "nothing-here") is None


def _common(world: dict[str, Path]) -> list[str]:
    return ["--model", TOY_MODEL, "--pins-dir", str(world["pins"])]


# writer name -> (kind it writes, the command line that writes to TARGET)
WRITERS: dict[str, tuple[str, Callable[[dict[str, Path], Path], list[str]]]] = {
    "run --output": (REPORT, lambda w, t: ["run", *_common(w), "--engine", "fake", "-o", str(t)]),
    "run --save-trace": (TRACE, lambda w, t: ["run", *_common(w), "--engine", "fake", "--save-trace", str(t)]),
    "export-prompts -o": (SUITE, lambda w, t: ["export-prompts", *_common(w), "-o", str(t)]),
    "goldens record --golden": (
        GOLDEN,
        lambda w, t: ["goldens", "record", *_common(w), "--engine", "fake", "--golden", str(t)],
    ),
    "compare -o": (REPORT, lambda w, t: ["compare", str(w["pin"]), str(w[TRACE]), "-o", str(t)]),
    "goldens check --output": (
        REPORT,
        lambda w, t: ["goldens", "check", *_common(w), "--engine", "fake", "--golden", str(w[GOLDEN]), "-o", str(t)],
    ),
}
KINDS = (TRACE, GOLDEN, PROGRESS, REPORT, PIN, SUITE, SETTINGS)


def _copy(world: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    target = tmp_path / f"target-{world[kind].name}"
    target.write_bytes(world[kind].read_bytes())
    return target


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_writes_over_its_input(
    writer: str, force: bool, world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    _, args = WRITERS[writer]
    before = world["pin"].read_bytes()
    r = invoke([*args(world, world["pin"]), *(["--force"] if force else [])])
    assert r.exit_code == 2, r.output
    assert "is the input" in r.stderr and "Traceback" not in r.output
    assert world["pin"].read_bytes() == before


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_replaces_only_its_own_kind_and_only_with_force(
    writer: str, kind: str, force: bool, world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    writes, args = WRITERS[writer]
    target = _copy(world, kind, tmp_path)
    before = target.read_bytes()
    r = invoke([*args(world, target), *(["--force"] if force else [])])
    if kind != writes:
        assert r.exit_code == 2, r.output
        assert "never replaces a file of another kind" in r.stderr, r.stderr
        assert target.read_bytes() == before
    elif not force:
        assert r.exit_code == 2, r.output
        assert "--force" in r.stderr
        assert target.read_bytes() == before
    else:
        assert r.exit_code in (0, 1), r.output
        assert file_kind(target) == writes


# ------------------------------------------------------------------- progress files


def _run_with_progress(world: dict[str, Path], progress: Path) -> list[str]:
    return ["run", *_common(world), "--engine", "fake", "--progress-file", str(progress)]


@pytest.mark.parametrize("kind", [k for k in KINDS if k != PROGRESS])
def test_a_progress_file_that_is_not_one_is_never_replaced(
    kind: str, world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    target = _copy(world, kind, tmp_path)
    before = target.read_bytes()
    r = invoke(_run_with_progress(world, target))
    assert r.exit_code == 2, r.output
    assert f"progress file {target}: is a " in r.stderr and "not a progress file" in r.stderr
    assert target.read_bytes() == before


def test_a_progress_file_of_another_run_is_never_replaced(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    target = tmp_path / "other.partial.jsonl"
    first, rest = world[PROGRESS].read_bytes().split(b"\n", 1)
    target.write_bytes(orjson.dumps({**orjson.loads(first), "model": "another/model"}) + b"\n" + rest)
    before = target.read_bytes()
    r = invoke(_run_with_progress(world, target))
    assert r.exit_code == 2, r.output
    assert "progress file of another run" in r.stderr
    assert target.read_bytes() == before


def test_a_progress_file_of_the_same_run_is_replaced(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    target = _copy(world, PROGRESS, tmp_path)
    r = invoke(_run_with_progress(world, target))
    assert r.exit_code == 0, r.output
    assert "replacing the progress file of an earlier run" in r.stderr


def test_a_progress_file_is_marked_so_it_is_told_from_a_trace(world: dict[str, Path], tmp_path: Path) -> None:
    from gate.core.traces.trace import TraceHeader
    from gate.workflows.common.progress import ProgressLog

    path = tmp_path / "run.partial.jsonl"
    log = ProgressLog.start(path, TraceHeader(role="candidate", model="m", top_k=0, engine={"name": "e"}))
    log.close()
    assert file_kind(path) == PROGRESS


# ------------------------------------------------------------------- the write itself


def test_atomic_write_never_replaces_another_kind_even_when_told_to(world: dict[str, Path], tmp_path: Path) -> None:
    pin = _copy(world, PIN, tmp_path)
    before = pin.read_bytes()
    with pytest.raises(InputError, match="never replaces a file of another kind"):
        atomic_write(pin, b"# a report\n", overwrite=True)
    with pytest.raises(InputError, match="never replaces a file of another kind"):
        atomic_write(pin, world[GOLDEN].read_bytes(), overwrite=True)
    assert pin.read_bytes() == before
    atomic_write(pin, world["pin"].read_bytes(), overwrite=True)  # its own kind: replaced
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    atomic_write(empty, b"# a report\n", overwrite=True)  # nothing to lose


def test_resume_never_cuts_a_file_that_is_not_a_progress_file(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_fake(monkeypatch)
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"line one\nline two without a newline")
    r = invoke([*_run_with_progress(world, notes), "--resume"])
    assert r.exit_code == 2, r.output
    assert "not a progress file" in r.stderr
    assert notes.read_bytes() == b"line one\nline two without a newline"
