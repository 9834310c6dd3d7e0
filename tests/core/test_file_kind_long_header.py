"""A file's kind is told from the line the trace reader takes for its header: the first
non-blank one (the reader skips blank lines), whole, however long. A pin whose first lines
are blank was taken for a report (its first line holds no header), and so was one whose
header passes the first MB read to tell it (a suite of 15,000 prompts puts 1.2 MB of
`prompt_sha256` in a pin's header): a report is the one kind `--force` replaces with
anything, so `gate compare -o PIN --force` replaced the pin with a report."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

from gate.core.storage.atomic import GOLDEN, PIN, PROGRESS, TRACE, atomic_write, file_kind
from gate.errors import InputError

HEADER = {"gate_trace": 1, "model": "m", "top_k": 1, "engine": {"name": "e", "version": "1"}}
ORACLE_RECORD = {"id": "p", "prompt_token_ids": [1], "token_ids": [2], "top_logprobs": [[[2, -0.1]]]}
BIG = {"prompt_sha256": {f"p{i:06d}": "ab" * 32 for i in range(15_000)}}  # 1.2 MB


def _trace(role: str, big: bool, **extra: object) -> bytes:
    head = {**HEADER, "role": role, **(BIG if big else {}), **extra}
    rec = ORACLE_RECORD if role == "oracle" else {k: v for k, v in ORACLE_RECORD.items() if k != "top_logprobs"}
    return orjson.dumps(head) + b"\n" + orjson.dumps(rec) + b"\n"


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (PIN, _trace("oracle", True)),
        (TRACE, _trace("candidate", True)),
        (GOLDEN, _trace("oracle", True, golden=1)),
        (PROGRESS, _trace("candidate", True, gate_progress=1)),
    ],
)
def test_the_kind_of_a_file_with_a_long_header_is_its_kind(tmp_path: Path, kind: str, data: bytes) -> None:
    assert len(data.split(b"\n", 1)[0]) > 1024 * 1024
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    assert file_kind(path) == kind
    # The same bytes written again over it: the same kind, so --force replaces it ...
    atomic_write(path, data, overwrite=True)
    # ... and a report never does.
    with pytest.raises(InputError, match="another kind"):
        atomic_write(path, b'{"gate_report": 1}\n', overwrite=True)
    assert path.read_bytes() == data


def test_gate_compare_never_writes_a_report_over_a_pin_with_a_long_header(tmp_path: Path) -> None:
    oracle, cand, pin = tmp_path / "o.jsonl", tmp_path / "c.jsonl", tmp_path / "pin.jsonl"
    oracle.write_bytes(_trace("oracle", False))
    cand.write_bytes(_trace("candidate", False))
    pin.write_bytes(_trace("oracle", True))
    before = pin.read_bytes()
    r = invoke(["compare", str(oracle), str(cand), "--format", "json", "-o", str(pin), "--force"])
    assert r.exit_code == 2, r.output
    assert "is a pin (oracle trace)" in r.stderr
    assert pin.read_bytes() == before


def test_a_first_line_past_every_limit_is_never_taken_for_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header line too long to read whole (past the limit) is of no kind gate can tell:
    nothing replaces it, --force or not."""
    import gate.core.storage.atomic as atomic

    monkeypatch.setattr(atomic, "MAX_KIND_LINE_BYTES", 2 * 1024 * 1024)
    path = tmp_path / "f.jsonl"
    data = orjson.dumps({**HEADER, "role": "oracle", "pad": "x" * (3 * 1024 * 1024)}) + b"\n"
    path.write_bytes(data)
    kind = file_kind(path)
    assert kind not in (None, atomic.REPORT)
    with pytest.raises(InputError, match="another kind"):
        atomic_write(path, b'{"gate_report": 1}\n', overwrite=True)


@pytest.mark.parametrize("lead", [b"\n", b"\n  \n", b"\r\n", b" \t\n\n"])
def test_blank_lines_before_the_header_do_not_hide_the_kind(tmp_path: Path, lead: bytes) -> None:
    from gate.core.traces.reader import read_trace

    path = tmp_path / "pin.jsonl"
    data = lead + _trace("oracle", False)
    path.write_bytes(data)
    assert read_trace(path).role == "oracle"  # the reader takes it for a pin ...
    assert file_kind(path) == PIN  # ... and so does the rule of what may replace it
    with pytest.raises(InputError, match="another kind"):
        atomic_write(path, b'{"gate_report": 1}\n', overwrite=True)
    assert path.read_bytes() == data
