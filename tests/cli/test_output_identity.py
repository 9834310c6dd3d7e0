"""Edges of the file rules: an output that is one of the inputs is refused by file identity (also
through a symlink or a hard link), before anything is written, for every command that
writes one; the whole trace file has a memory budget, not only each line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.gate_cli import invoke
from helpers.pin_attacks import PIN, candidate, same, write


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    oracle = tmp_path / "oracle.jsonl"
    oracle.write_bytes(PIN.read_bytes())
    return oracle, write(tmp_path / "cand.jsonl", *candidate(same))


@pytest.mark.parametrize("how", ["itself", "symlink", "hard link"])
@pytest.mark.parametrize("which", [0, 1])
def test_compare_never_writes_its_report_over_an_input(pair: tuple[Path, Path], how: str, which: int) -> None:
    target = pair[which]
    before = target.read_bytes()
    out = target
    if how == "symlink":
        out = target.with_name("link.jsonl")
        out.symlink_to(target)
    elif how == "hard link":
        out = target.with_name("hard.jsonl")
        os.link(target, out)
    r = invoke(["compare", str(pair[0]), str(pair[1]), "-o", str(out), "--force"])
    assert r.exit_code == 2, r.output
    assert "is the input" in r.stderr and "never its own output" in r.stderr
    assert target.read_bytes() == before
    assert not list(target.parent.glob("*.bak-*"))  # nothing replaced, so no backup either


def test_run_never_writes_over_its_candidate_trace(pair: tuple[Path, Path]) -> None:
    cand = pair[1]
    before = cand.read_bytes()
    for flag in ("-o", "--save-trace"):
        r = invoke(["run", "--candidate-trace", str(cand), flag, str(cand), "--force"])
        assert r.exit_code == 2, r.output
        assert "is the input" in r.stderr
    assert cand.read_bytes() == before


def test_two_outputs_in_one_file_are_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text("x")
    r = invoke(["run", "--candidate-trace", str(pair[1]), "-o", str(out), "--save-trace", str(out), "--force"])
    assert r.exit_code == 2, r.output
    assert "another output" in r.stderr


def test_merge_never_writes_over_a_shard(pair: tuple[Path, Path]) -> None:
    shard = pair[1]
    before = shard.read_bytes()
    r = invoke(["merge", str(shard), "-o", str(shard), "--force"])
    assert r.exit_code == 2, r.output
    assert "is the input" in r.stderr and shard.read_bytes() == before


def test_a_file_of_lines_just_under_the_line_check_is_refused_within_the_budget(tmp_path: Path) -> None:
    """46 MB of lines just under 8 MB of `[],` took 1.2 GB before it was refused: the whole
    file has a memory budget (`MAX_TRACE_COST`), counted before each line is parsed."""
    from gate.core.traces.reader import _COST_CHECK_BYTES, MAX_TRACE_COST, read_trace
    from gate.errors import TraceError

    head = b'{"gate_trace":1,"role":"candidate","model":"m","top_k":0,"engine":{"name":"x","version":"1"}}\n'
    junk = b"[]," * ((_COST_CHECK_BYTES - 200) // 3)
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        fh.write(head)
        for i in range(6):
            fh.write(b'{"id":"p%d","prompt_token_ids":[1],"token_ids":[2],"junk":[' % i + junk + b"[]]}\n")
    assert path.stat().st_size > 45_000_000
    with pytest.raises(TraceError, match="refused") as err:
        read_trace(path)
    # Refused at the line that would pass the budget, not after parsing all of them.
    per_line = (64 + 32) * len(junk) // 3
    assert err.value.line is not None and err.value.line <= 2 + MAX_TRACE_COST // per_line
    assert "for a whole trace" in str(err.value)


def test_an_honest_large_trace_stays_well_within_the_budget() -> None:
    """The default pin (top-20 at every position) costs a small part of the budget: its
    lists are kept as arrays."""
    from gate.core.traces import reader as trace_mod

    seen: list[int] = []
    real = trace_mod._compacted

    def spy(top: object) -> int:
        n = real(top)
        seen.append(n)
        return n

    trace_mod._compacted = spy  # type: ignore[assignment]
    try:
        trace_mod.read_trace(PIN)
    finally:
        trace_mod._compacted = real  # type: ignore[assignment]
    assert sum(seen) > 0  # the arrays' savings were counted
    assert PIN.stat().st_size * 40 < trace_mod.MAX_TRACE_COST


def test_run_never_writes_over_its_pin(tmp_path: Path) -> None:
    import shutil

    pins = tmp_path / "pins"
    folder = pins / "HuggingFaceTB" / "SmolLM2-135M-Instruct"
    shutil.copytree(PIN.parent, folder)
    pin_file = folder / "pin.jsonl"
    before = pin_file.read_bytes()
    cand = write(tmp_path / "cand.jsonl", *candidate(same))
    r = invoke(["run", "--pins-dir", str(pins), "--candidate-trace", str(cand), "-o", str(pin_file), "--force"])
    assert r.exit_code == 2, r.output
    assert "is the input" in r.stderr and pin_file.read_bytes() == before
