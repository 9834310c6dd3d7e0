"""The catalogue of bad input: every case exits 2 with one line naming the culprit, no traceback.

Trace and file faults go through the real command (`gate compare`, via `main()`, which
maps errors to exit codes); the 1 GB line and unreadable files also through `read_trace`.
"""

from __future__ import annotations

import io
import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from gate.cli.main import main
from gate.core.engine import parse_options
from gate.core.traces.reader import MAX_LINE_BYTES, read_trace
from gate.engines import registry
from gate.errors import InputError, TraceError

Lines = list[dict[str, Any]]

ORACLE_HEADER: dict[str, Any] = {
    "gate_trace": 1,
    "role": "oracle",
    "model": "org/tiny",
    "top_k": 3,
    "engine": {"name": "vllm", "version": "0.11.0"},
}


def oracle_lines() -> Lines:
    return [
        dict(ORACLE_HEADER),
        {
            "id": "p1",
            "prompt_token_ids": [1, 2, 3],
            "token_ids": [5, 6],
            "top_logprobs": [[[5, -0.1], [7, -2.5], [9, -3.0]], [[6, -0.25], [5, -1.5], [8, -4.0]]],
            "finish_reason": "length",
        },
        {
            "id": "p2",
            "prompt_token_ids": [4, 2],
            "token_ids": [7, 8],
            "top_logprobs": [[[7, -0.5], [3, -1.0], [4, -1.0]], [[8, -0.125], [2, -2.0], [6, -9.0]]],
            "finish_reason": "length",
            "prompt": "héllo",
        },
    ]


def candidate_lines() -> Lines:
    header = dict(ORACLE_HEADER, role="candidate", top_k=0, engine={"name": "hf", "version": "4.56"})
    recs = [{k: v for k, v in r.items() if k != "top_logprobs"} for r in oracle_lines()[1:]]
    return [header, *recs]


def encode(lines: Lines) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def gate(argv: list[str]) -> tuple[int, str, str]:
    """Run the real `gate` entry point in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    real_out = sys.stdout
    sys.stdout = out
    try:
        with redirect_stderr(err), pytest.raises(SystemExit) as exc:
            main(argv)
    finally:
        sys.stdout = real_out
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out.getvalue(), err.getvalue()


def assert_input_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    assert err.startswith("gate: error: "), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def assert_usage_error(code: int, err: str, *needles: str) -> None:
    """Typer's own refusals (a bad option value, an unreadable path): exit 2, a boxed message."""
    assert code == 2, err
    assert "Traceback" not in err, err
    flat = " ".join(err.replace("│", " ").replace("╭", " ").replace("╰", " ").replace("─", " ").split())
    for needle in needles:
        assert needle in flat, f"{needle!r} not in {flat!r}"


@pytest.fixture
def files(tmp_path: Path) -> Callable[[bytes | None, bytes | None], tuple[Path, Path]]:
    """Write an oracle and a candidate trace (valid ones unless bytes are given)."""

    def write(oracle: bytes | None = None, candidate: bytes | None = None) -> tuple[Path, Path]:
        o, c = tmp_path / "oracle.jsonl", tmp_path / "candidate.jsonl"
        o.write_bytes(encode(oracle_lines()) if oracle is None else oracle)
        c.write_bytes(encode(candidate_lines()) if candidate is None else candidate)
        return o, c

    return write


def test_the_valid_pair_passes(files: Callable[..., tuple[Path, Path]]) -> None:
    # The control: every case below breaks exactly one thing of this pair.
    o, c = files()
    code, out, err = gate(["compare", str(o), str(c), "--format", "json"])
    assert code == 0, err
    assert orjson.loads(out)["verdict"] == "strict_pass"


# --------------------------------------------------------------------------- trace content


def _edit(fn: Callable[[Lines], None]) -> Callable[[], bytes]:
    def make() -> bytes:
        lines = oracle_lines()
        fn(lines)
        return encode(lines)

    return make


def _set(line: int, key: str, value: Any) -> Callable[[], bytes]:
    def fn(lines: Lines) -> None:
        lines[line - 1][key] = value

    return _edit(fn)


def _drop(line: int, key: str) -> Callable[[], bytes]:
    def fn(lines: Lines) -> None:
        del lines[line - 1][key]

    return _edit(fn)


def _top(line: int, pos: int, value: Any) -> Callable[[], bytes]:
    def fn(lines: Lines) -> None:
        lines[line - 1]["top_logprobs"][pos] = value

    return _edit(fn)


def _replace_line(line: int, raw: bytes) -> Callable[[], bytes]:
    def make() -> bytes:
        parts = encode(oracle_lines()).split(b"\n")
        parts[line - 1] = raw
        return b"\n".join(parts)

    return make


def _cut(line: int, at: Callable[[bytes], int]) -> Callable[[], bytes]:
    """The file cut off inside `line` (as a killed writer or a partial copy leaves it)."""

    def make() -> bytes:
        parts = encode(oracle_lines()).split(b"\n")
        return b"".join(p + b"\n" for p in parts[: line - 1]) + parts[line - 1][: at(parts[line - 1])]

    return make


_BIG = 2**53
# (case id, oracle bytes, substrings the one-line message must hold)
ORACLE_CASES: list[tuple[str, Callable[[], bytes], tuple[str, ...]]] = [
    ("empty-file", lambda: b"", ("oracle.jsonl", "empty file")),
    ("blank-lines-only", lambda: b"\n  \n\t\n", ("oracle.jsonl", "empty file")),
    ("truncated-mid-line", _cut(3, lambda raw: len(raw) // 2), ("oracle.jsonl:3", "truncated")),
    ("truncated-mid-header", _cut(1, lambda raw: 20), ("oracle.jsonl:1", "truncated")),
    ("truncated-mid-character", _cut(3, lambda raw: raw.index("é".encode()) + 1), ("oracle.jsonl:3", "truncated")),
    ("bad-json", _replace_line(3, b'{"id": "p2",, }'), ("oracle.jsonl:3", "bad JSON")),
    ("nul-bytes", lambda: b"\x00" * 64, ("oracle.jsonl:1", "bad JSON")),
    (
        "non-utf8-byte",
        _replace_line(3, encode(oracle_lines()[2:]).strip().replace("é".encode(), b"\xe9")),
        ("oracle.jsonl:3", "not valid UTF-8"),
    ),
    ("utf16-file", lambda: encode(oracle_lines()).decode().encode("utf-16"), ("oracle.jsonl:1", "UTF-16")),
    ("utf8-bom", lambda: b"\xef\xbb\xbf" + encode(oracle_lines()), ("oracle.jsonl:1", "byte order mark")),
    (
        "nan-literal",
        _replace_line(2, b'{"id": "p1", "prompt_token_ids": [1], "token_ids": [5], "top_logprobs": [[[5, NaN]]]}'),
        ("oracle.jsonl:2", "NaN"),
    ),
    (
        "infinite-logprob",
        _replace_line(2, b'{"id": "p1", "prompt_token_ids": [1], "token_ids": [5], "top_logprobs": [[[5, -1e400]]]}'),
        ("oracle.jsonl:2", "infinity"),
    ),
    # header
    ("no-header", lambda: encode(oracle_lines()[1:]), ("oracle.jsonl:1", "field 'gate_trace'")),
    ("header-not-object", _replace_line(1, b"[1]"), ("oracle.jsonl:1", "header must be a JSON object")),
    ("wrong-version", _set(1, "gate_trace", 2), ("oracle.jsonl:1", "field 'gate_trace'", "version 2")),
    ("version-as-string", _set(1, "gate_trace", "1"), ("oracle.jsonl:1", "field 'gate_trace'")),
    ("bad-role", _set(1, "role", "judge"), ("oracle.jsonl:1", "field 'role'")),
    (
        "candidate-given-as-oracle",
        _set(1, "role", "candidate"),
        ("oracle.jsonl:1", "field 'role'", "expected an oracle"),
    ),
    ("model-missing", _drop(1, "model"), ("oracle.jsonl:1", "field 'model'")),
    ("top-k-zero-oracle", _set(1, "top_k", 0), ("oracle.jsonl:1", "field 'top_k'")),
    ("engine-not-object", _set(1, "engine", "vllm"), ("oracle.jsonl:1", "field 'engine'")),
    ("engine-version-missing", _set(1, "engine", {"name": "vllm"}), ("oracle.jsonl:1", "field 'engine.version'")),
    # records
    ("record-not-object", _replace_line(2, b"[1, 2]"), ("oracle.jsonl:2", "JSON object")),
    ("id-missing", _drop(2, "id"), ("oracle.jsonl:2", "field 'id'", "missing")),
    ("id-not-string", _set(2, "id", 7), ("oracle.jsonl:2", "field 'id'")),
    ("id-duplicate", _set(3, "id", "p1"), ("oracle.jsonl:3", "field 'id'", "duplicate", "line 2")),
    ("token-ids-missing", _drop(2, "token_ids"), ("oracle.jsonl:2", "field 'token_ids'", "missing")),
    ("token-ids-string", _set(2, "token_ids", "5 6"), ("oracle.jsonl:2", "field 'token_ids'")),
    ("token-id-float", _set(2, "token_ids", [5.0, 6]), ("oracle.jsonl:2", "field 'token_ids[0]'")),
    ("token-id-bool", _set(2, "prompt_token_ids", [1, True]), ("oracle.jsonl:2", "field 'prompt_token_ids[1]'")),
    ("token-id-negative", _set(2, "prompt_token_ids", [1, -2]), ("oracle.jsonl:2", "prompt_token_ids[1]", "negative")),
    ("oracle-top-missing", _drop(3, "top_logprobs"), ("oracle.jsonl:3", "field 'top_logprobs'", "missing")),
    ("top-not-list", _set(2, "top_logprobs", {"5": -0.1}), ("oracle.jsonl:2", "field 'top_logprobs'")),
    ("top-length", _set(2, "top_logprobs", [[[5, -0.1]]]), ("oracle.jsonl:2", "1 positions for 2")),
    ("top-position-empty", _top(2, 0, []), ("oracle.jsonl:2", "field 'top_logprobs[0]'", "empty")),
    ("top-pair-of-three", _top(2, 0, [[5, -0.1, 0]]), ("oracle.jsonl:2", "field 'top_logprobs[0][0]'", "pair")),
    ("top-id-negative", _top(2, 1, [[6, -0.25], [-5, -1.5]]), ("oracle.jsonl:2", "top_logprobs[1][1]", "negative")),
    ("logprob-string", _top(2, 0, [[5, "-0.1"]]), ("oracle.jsonl:2", "top_logprobs[0][0]", "must be a number")),
    ("logprob-above-zero", _top(2, 0, [[5, 0.5]]), ("oracle.jsonl:2", "top_logprobs[0][0]", "above 0")),
    (
        "top-out-of-order",
        _top(2, 0, [[5, -0.1], [9, -3.0], [7, -2.5]]),
        ("oracle.jsonl:2", "top_logprobs[0][2]", "out of order"),
    ),
    (
        "top-tie-out-of-id-order",
        _top(3, 0, [[7, -0.5], [4, -1.0], [3, -1.0]]),
        ("oracle.jsonl:3", "top_logprobs[0][2]", "out of order"),
    ),
    ("top-repeated-id", _top(2, 0, [[5, -0.1], [5, -0.2]]), ("oracle.jsonl:2", "top_logprobs[0][1]", "twice")),
    (
        "oracle-lacks-chosen",
        _top(2, 1, [[2, -0.25], [5, -1.5]]),
        ("oracle.jsonl:2", "field 'top_logprobs[1]'", "does not contain the chosen token 6"),
    ),
    (
        "oracle-not-greedy",
        _top(2, 1, [[2, -0.1], [6, -0.25]]),
        ("oracle.jsonl:2", "field 'top_logprobs[1]'", "not the greedy choice"),
    ),
    (
        "oracle-tie-took-higher-id",
        _top(2, 1, [[2, -0.25], [6, -0.25]]),
        ("oracle.jsonl:2", "field 'top_logprobs[1]'", "torch.argmax"),
    ),
    # Past 2**53 float64 cannot tell ids apart: the fast path once "found" a chosen token
    # the list lacks.
    (
        "oracle-lacks-chosen-huge-id",
        _edit(lambda ls: ls[1].update(token_ids=[_BIG + 1], top_logprobs=[[[_BIG, -0.1]]])),
        ("oracle.jsonl:2", "field 'top_logprobs[0]'", f"chosen token {_BIG + 1}"),
    ),
    # JSON integers reach 2**64 - 1, past int64: once an OverflowError (a crash, exit 3).
    (
        "oracle-chosen-past-int64",
        _edit(lambda ls: ls[1].update(token_ids=[2**64 - 1, 6])),
        ("oracle.jsonl:2", "field 'top_logprobs[0]'", f"chosen token {2**64 - 1}"),
    ),
    (
        "top-id-past-int64",
        _top(2, 0, [[2**64 - 1, -0.1]]),
        ("oracle.jsonl:2", "field 'top_logprobs[0]'", "chosen token 5"),
    ),
    ("finish-reason", _set(2, "finish_reason", "eos"), ("oracle.jsonl:2", "field 'finish_reason'")),
    ("prompt-not-string", _set(2, "prompt", ["a"]), ("oracle.jsonl:2", "field 'prompt'")),
    ("tokens-length", _set(2, "tokens", ["a"]), ("oracle.jsonl:2", "field 'tokens'", "1 entries for 2")),
    ("forced-in-oracle", _set(2, "forced_token_ids", [5, 6]), ("oracle.jsonl:2", "field 'forced_token_ids'")),
]


@pytest.mark.parametrize(("oracle", "needles"), [c[1:] for c in ORACLE_CASES], ids=[c[0] for c in ORACLE_CASES])
def test_bad_oracle_trace(
    files: Callable[..., tuple[Path, Path]], oracle: Callable[[], bytes], needles: tuple[str, ...]
) -> None:
    o, c = files(oracle=oracle())
    code, out, err = gate(["compare", str(o), str(c)])
    assert_input_error(code, err, *needles)
    assert out == "", "nothing goes to stdout on an input error"
    assert err.count("\n") == 1, f"one line, not {err!r}"


def _cand(fn: Callable[[Lines], object]) -> Callable[[], bytes]:
    def make() -> bytes:
        lines = candidate_lines()
        fn(lines)
        return encode(lines)

    return make


CANDIDATE_CASES: list[tuple[str, Callable[[], bytes], tuple[str, ...]]] = [
    (
        "oracle-given-as-candidate",
        lambda: encode(oracle_lines()),
        ("candidate.jsonl:1", "field 'role'", "expected a candidate"),
    ),
    (
        "forced-negative",
        _cand(lambda ls: ls[1].update(forced_token_ids=[-1, 6])),
        ("candidate.jsonl:2", "field 'forced_token_ids[0]'", "negative"),
    ),
    (
        "candidate-top-unsorted",
        _cand(lambda ls: (ls[0].update(top_k=2), ls[1].update(top_logprobs=[[[5, -2.0], [7, -1.0]], []]))),
        ("candidate.jsonl:2", "top_logprobs[0][1]", "out of order"),
    ),
    ("prompt-missing", _cand(lambda ls: ls.pop()), ("candidate.jsonl", "missing prompt", "'p2'")),
    (
        "prompt-extra",
        _cand(lambda ls: ls.append(dict(ls[1], id="p9"))),
        ("candidate.jsonl", "'p9'", "not in the oracle"),
    ),
    (
        "prompt-drift",
        _cand(lambda ls: ls[2].update(prompt_token_ids=[4, 3])),
        ("prompt 'p2'", "prompt_token_ids differ at index 1"),
    ),
]


@pytest.mark.parametrize(
    ("candidate", "needles"), [c[1:] for c in CANDIDATE_CASES], ids=[c[0] for c in CANDIDATE_CASES]
)
def test_bad_candidate_trace(
    files: Callable[..., tuple[Path, Path]], candidate: Callable[[], bytes], needles: tuple[str, ...]
) -> None:
    o, c = files(candidate=candidate())
    code, _, err = gate(["compare", str(o), str(c)])
    assert_input_error(code, err, *needles)


# --------------------------------------------------------------------------- the file itself


def test_missing_file(files: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    _, c = files()
    code, _, err = gate(["compare", str(tmp_path / "nope.jsonl"), str(c)])
    assert_input_error(code, err, "nope.jsonl", "no such file")


def test_a_directory(files: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    o, _ = files()
    code, _, err = gate(["compare", str(o), str(tmp_path)])
    assert_input_error(code, err, str(tmp_path), "is a directory")


def test_no_traceback_from_the_real_command(files: Callable[..., tuple[Path, Path]], tmp_path: Path) -> None:
    # The installed entry point, in a fresh interpreter: what CI logs will show.
    o, _ = files()
    r = subprocess.run(
        [sys.executable, "-m", "gate", "compare", str(o), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GATE_DEBUG": ""},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"gate: error: {tmp_path}: is a directory, not a trace file\n"
    assert r.stdout == ""


@pytest.fixture
def one_gb_line(tmp_path: Path) -> Iterator[Path]:
    """A header, then a 1 GiB line: a sparse file, so no disk or memory is spent making it."""
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as fh:
        fh.write(encode(oracle_lines()[:1]) + b'{"id": "p1", "prompt": "')
        fh.truncate(fh.tell() + 2**30)
    yield path
    path.unlink()


def test_a_1gb_line_is_refused_unread(one_gb_line: Path) -> None:
    import tracemalloc

    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(TraceError) as exc:
            read_trace(one_gb_line)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.line == 2
    assert "longer than" in str(exc.value)
    # Refused once past the limit: never the whole gigabyte in memory.
    assert peak < MAX_LINE_BYTES + 64 * 2**20, peak
    assert elapsed < 20, elapsed


def test_a_1gb_line_through_the_command(one_gb_line: Path, files: Callable[..., tuple[Path, Path]]) -> None:
    _, c = files()
    code, _, err = gate(["compare", str(one_gb_line), str(c)])
    assert_input_error(code, err, f"{one_gb_line}:2", "longer than the 268435456-byte limit")


def test_an_endless_stream_is_refused() -> None:
    # /dev/zero: no size, no newline, no end.
    with pytest.raises(TraceError, match="line is longer than"):
        read_trace("/dev/zero")


# --------------------------------------------------------------------------- permissions


def _as_nobody(fn: Callable[[], str]) -> str:
    """Run `fn` in a forked child that dropped root for the user nobody; return what it returns."""
    nobody = pwd.getpwnam("nobody")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            answer = fn()
        except BaseException as exc:  # report anything, the parent asserts
            answer = f"child raised {type(exc).__name__}: {exc}"
        os.write(w, answer.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = fh.read().decode()
    os.waitpid(pid, 0)
    return answer


@pytest.fixture
def unreadable(files: Callable[..., tuple[Path, Path]]) -> Iterator[tuple[Path, Path, Path]]:
    """(unreadable oracle, readable oracle, candidate) in a folder anyone may enter."""
    folder = Path(tempfile.mkdtemp(prefix="gate-perm-"))
    try:
        folder.chmod(0o755)
        o, c = files()
        locked, open_ = folder / "locked.jsonl", folder / "open.jsonl"
        for p in (locked, open_, folder / "cand.jsonl"):
            p.write_bytes(o.read_bytes() if p != folder / "cand.jsonl" else c.read_bytes())
            p.chmod(0o644)
        locked.chmod(0o000)
        yield locked, open_, folder / "cand.jsonl"
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


def _skip_unless_privileges_can_drop() -> None:
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and there is no user 'nobody' to drop to: chmod 000 cannot stop root")


def test_unreadable_file(unreadable: tuple[Path, Path, Path]) -> None:
    _skip_unless_privileges_can_drop()
    locked, open_, _ = unreadable

    def attempt() -> str:
        try:
            read_trace(locked)
        except TraceError as exc:
            return f"TraceError {exc}"
        return "read it"

    def control() -> str:
        return f"read {len(read_trace(open_).records)} records"

    if os.geteuid() == 0:
        # Root reads mode 000 anyway: the check must run as someone the mode stops.
        assert _as_nobody(control) == "read 2 records"
        answer = _as_nobody(attempt)
    else:
        answer = attempt()
    assert answer == f"TraceError {locked}: permission denied"


def test_unreadable_file_through_the_command(unreadable: tuple[Path, Path, Path]) -> None:
    _skip_unless_privileges_can_drop()
    locked, _, cand = unreadable

    def attempt() -> str:
        code, _, err = gate(["compare", str(locked), str(cand)])
        return f"{code}|{err}"

    answer = _as_nobody(attempt) if os.geteuid() == 0 else attempt()
    code, _, err = answer.partition("|")
    # Typer checks that a path argument is readable before gate sees it.
    assert_usage_error(int(code), err, f"path '{locked}' is not readable")


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--near-tie-mnats", "-1"], ("--near-tie-mnats", "-1.0")),
        (["--near-tie-mnats", "nan"], ("--near-tie-mnats", "nan")),
        (["--near-tie-mnats", "inf"], ("--near-tie-mnats", "inf")),
        (["--near-tie-mnats=-0.001"], ("--near-tie-mnats", ">= 0")),
        (["--near-tie-ulps", "-2"], ("--near-tie-ulps",)),
        (["--near-tie-ulps", "nan"], ("--near-tie-ulps",)),
    ],
)
def test_bad_near_tie_threshold(
    files: Callable[..., tuple[Path, Path]], argv: list[str], needles: tuple[str, ...]
) -> None:
    o, c = files()
    code, _, err = gate(["compare", str(o), str(c), *argv])
    assert_input_error(code, err, *needles)


@pytest.mark.parametrize("value", ["abc", "", "1,5"])
def test_near_tie_threshold_not_a_number(files: Callable[..., tuple[Path, Path]], value: str) -> None:
    # Typer's own usage error: exit 2 and a message naming the option, no traceback.
    o, c = files()
    code, out, err = gate(["compare", str(o), str(c), "--near-tie-mnats", value])
    assert out == ""
    assert_usage_error(code, err, "Invalid value for '--near-tie-mnats'")


class ToyEngine:
    """A stand-in engine with a typed option schema, built the way the registry builds engines."""

    name = "toy"
    SCHEMA: ClassVar[dict[str, tuple[type, Any]]] = {
        "batch_size": (int, 1),
        "temperature": (float, 0.0),
        "compile": (bool, False),
        "dtype": (str, "bfloat16"),
    }

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.options = parse_options(self.name, options, self.SCHEMA)

    # The rest of the plugin contract, which the registry checks before it hands an engine out.
    def info(self) -> Any:
        raise NotImplementedError

    def generate(self, prompts: Any, top_k: int) -> Any:
        raise NotImplementedError

    def encode(self, text: str) -> Any:
        raise NotImplementedError

    def decode_tokens(self, token_ids: Any) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BUILTIN, "toy", f"{__name__}:ToyEngine")


def test_engine_options_of_the_right_type(toy_registered: None) -> None:
    engine = registry.load_engine("toy", "org/tiny", {"batch_size": "8", "temperature": "0.5", "compile": "Yes"})
    assert engine.options == {"batch_size": 8, "temperature": 0.5, "compile": True, "dtype": "bfloat16"}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("key", "value", "expects"),
    [
        ("batch_size", "eight", "int"),
        ("batch_size", "1.5", "int"),
        ("batch_size", "", "int"),
        ("temperature", "warm", "float"),
        ("temperature", "nan", "float"),
        ("compile", "maybe", "bool"),
        ("compile", "2", "bool"),
    ],
)
def test_engine_option_of_the_wrong_type(toy_registered: None, key: str, value: str, expects: str) -> None:
    with pytest.raises(InputError) as exc:
        registry.load_engine("toy", "org/tiny", {key: value})
    assert exc.value.exit_code == 2
    assert str(exc.value) == f"--engine-opt {key}={value}: expected {expects} for engine 'toy'"


def test_unknown_engine_option(toy_registered: None) -> None:
    with pytest.raises(InputError) as exc:
        registry.load_engine("toy", "org/tiny", {"batchsize": "8"})
    assert exc.value.exit_code == 2
    assert "--engine-opt batchsize: unknown option for engine 'toy'" in str(exc.value)
    assert "batch_size" in str(exc.value), "the message lists the known options"


@pytest.mark.parametrize("pair", ["batch_size", "=8", " =8"])
def test_engine_opt_without_key_value(pair: str) -> None:
    from gate.workflows.common.requests import parse_engine_opts

    with pytest.raises(InputError, match="expected key=value"):
        parse_engine_opts([pair])
