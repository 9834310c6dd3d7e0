"""`gate diff` on reports that lie or are not reports at all.

A report whose fields contradict one another (a failing verdict with exit code 0, a pass
with a defect in it, a verdict gate never writes) is an input error, exit 2, naming the
field: `gate diff` judges by what a report says it found, never by the one field a writer
could flip. A file that is not a report is refused before it is parsed: bounded in size
(a device, a sparse file), in what parsing it would cost, and in depth.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import header, mixed_records, write_jsonl

from gate.core.storage import json_file
from gate.errors import InputError


@pytest.fixture
def base(tmp_path: Path) -> Path:
    oracle, cand = mixed_records()
    o = write_jsonl(tmp_path / "oracle.jsonl", header("oracle"), oracle)
    c = write_jsonl(tmp_path / "candidate.jsonl", header("candidate"), cand)
    out = tmp_path / "base.json"
    r = invoke(["compare", str(o), str(c), "--format", "json", "-o", str(out)])
    assert r.exit_code == 1, r.output
    return out


def edited(base: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(base.read_text())
    edit(data)
    out = base.with_name(name)
    out.write_text(json.dumps(data))
    return out


def _set(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.update(fields)


def _pass_with_everything_ratified(d: dict[str, Any]) -> None:
    """A passing verdict and exit code, over prompts and divergences that still hold a defect."""
    d.update(verdict="ratified_pass", exit_code=0)
    for p in d["prompts"]:
        p["ratified"] = True


def _strict_pass_over_a_diverging_prompt(d: dict[str, Any]) -> None:
    d.update(verdict="strict_pass", exit_code=0, divergences=[])
    for p in d["prompts"]:
        p["ratified"] = True


def _pass_beyond_the_floor(d: dict[str, Any]) -> None:
    d.update(verdict="ratified_pass", exit_code=0, divergences=[])
    for p in d["prompts"]:
        p["ratified"] = True
    d["distribution"] = {"beyond": True, "judged": True, "beyond_figures": ["mean KL 9 > 2"]}


def _a_divergence_of_no_prompt(d: dict[str, Any]) -> None:
    d["divergences"][0]["prompt_id"] = "no-such-prompt"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_set(exit_code=0), "exit_code"),  # verdict fail, exit 0
        (_set(verdict="strict_pass"), "exit_code"),  # a pass with exit 1
        (_set(verdict="excellent", exit_code=0), "verdict"),
        (_set(verdict="pass", exit_code=0), "verdict"),
        (_pass_with_everything_ratified, "over a defect"),
        (_strict_pass_over_a_diverging_prompt, "prompts"),
        (_pass_beyond_the_floor, "distribution"),
        (_a_divergence_of_no_prompt, "prompt_id"),
    ],
    ids=[
        "fail-exit-0",
        "pass-exit-1",
        "unknown-verdict",
        "pass-is-not-a-verdict",
        "ratified-pass-with-a-defect",
        "strict-pass-not-strict",
        "pass-beyond-the-floor",
        "divergence-of-no-prompt",
    ],
)
def test_a_report_contradicting_itself_is_exit_2_naming_the_field(
    base: Path, edit: Callable[[dict[str, Any]], None], field: str
) -> None:
    liar = edited(base, "liar.json", edit)
    for args in ([str(base), str(liar)], [str(liar), str(base)]):
        r = invoke(["diff", *args])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"gate: error: {liar}: "), r.stderr
        assert field in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr


def test_a_missing_strict_flag_is_not_read_as_off(base: Path) -> None:
    """A ratified pass is exit 0 or 1 by the doctrine's `strict`; without the field the
    report cannot be checked, and is refused rather than believed."""
    liar = edited(base, "no-strict.json", lambda d: d["doctrine"].pop("strict"))
    r = invoke(["diff", str(base), str(liar)])
    assert r.exit_code == 2, r.output
    assert "doctrine.strict" in r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_dev_zero_is_refused_at_once(base: Path) -> None:
    r = invoke(["diff", str(base), "/dev/zero"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("gate: error: /dev/zero: "), r.stderr
    assert "not a gate JSON report" in r.stderr


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_pipe_that_never_ends_is_read_no_further_than_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the file is (a pipe as `<(cmd)` gives, a device, a file growing under us),
    no more than the limit is read: a report that starts well and never ends is refused
    there, and the writer is left, not drained."""
    read_end, write_end = os.pipe()
    written: list[int] = []

    def writer() -> None:
        try:
            with os.fdopen(write_end, "wb", buffering=0) as fh:
                fh.write(b'{"gate_report": 1, "model": "')
                while sum(written) < 64 * 1024 * 1024:  # far past the limit
                    fh.write(b"x" * 65536)
                    written.append(65536)
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    monkeypatch.setattr(json_file, "MAX_JSON_BYTES", 1024 * 1024)
    try:
        with pytest.raises(InputError, match="more than 1048576 bytes"):
            json_file.read_json(f"/dev/fd/{read_end}", what="gate JSON report", opens=b"{")
    finally:
        os.close(read_end)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert sum(written) < 8 * 1024 * 1024


def test_a_report_that_would_cost_gigabytes_to_parse_is_refused_unparsed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """32 bytes of memory per byte of `[],` (a list each): refused by its estimated cost, as
    the trace reader refuses such a line (the limit scaled down with the file)."""
    monkeypatch.setattr(json_file, "MAX_JSON_COST", 64 * 1024 * 1024)
    heavy = tmp_path / "heavy.json"
    heavy.write_bytes(b'{"gate_report": 1, "x": [' + b"[]," * (3 * 1024 * 1024) + b"[]]}")
    r = invoke(["diff", str(heavy), str(heavy)])
    assert r.exit_code == 2, r.output
    assert "refused unparsed" in r.stderr, r.stderr


def test_a_report_nested_past_the_limit_is_refused(base: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    text = (
        base.read_text().rstrip()[:-1]
        + ', "distribution": {"beyond": false, "beyond_figures": '
        + "[" * 900
        + "]" * 900
        + "}}"
    )
    deep.write_text(text)
    r = invoke(["diff", str(base), str(deep)])
    assert r.exit_code == 2, r.output
    assert "levels deep" in r.stderr, r.stderr
