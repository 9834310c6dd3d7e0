"""Sharded suites: stable assignment by prompt id, and `gate merge` of the shard traces."""

from __future__ import annotations

import io
import subprocess
import sys
from collections import Counter
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import orjson
import pytest

from gate.cli.main import main
from gate.core.traces.reader import read_trace
from gate.core.traces.shards import merge_traces, parse_shard, select_shard, shard_of
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, encode_trace
from gate.errors import InputError

IDS = [f"prompt-{i:03d}" for i in range(40)]


# --------------------------------------------------------------------------- assignment


def test_shard_of_is_pinned() -> None:
    # SHA-256 of the UTF-8 id, first 8 bytes big-endian, mod N, plus one. Python's salted
    # hash() would change these from one process to the next; a changed hash function
    # would silently move prompts between the shards of a run in flight.
    got = [shard_of(i, 4) for i in ("p1", "p2", "p3", "hello", "é", "")]
    assert got == PINNED_4


PINNED_4 = [4, 1, 2, 3, 4, 1]


def test_shard_of_is_the_same_in_another_process() -> None:
    code = "from gate.core.traces.shards import shard_of; print([shard_of(f'prompt-{i:03d}', 7) for i in range(40)])"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {f"{[shard_of(i, 7) for i in IDS]}\n"}


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_shards_partition_the_suite(n: int) -> None:
    parts = [select_shard(IDS, k, n) for k in range(1, n + 1)]
    assert sorted(i for part in parts for i in part) == sorted(IDS), "every prompt in exactly one shard"
    for part in parts:
        assert part == [i for i in IDS if i in part], "suite order kept"
    assert all(1 <= shard_of(i, n) <= n for i in IDS)


def test_assignment_depends_on_the_id_alone() -> None:
    # Adding or removing other prompts never moves a prompt to another shard.
    assert select_shard(IDS[:10], 2, 3) == [i for i in select_shard(IDS, 2, 3) if i in IDS[:10]]


def test_shards_are_roughly_balanced() -> None:
    counts = Counter(shard_of(f"id{i}", 4) for i in range(4000))
    assert set(counts) == {1, 2, 3, 4}
    assert all(900 <= c <= 1100 for c in counts.values()), counts


@pytest.mark.parametrize(("text", "kn"), [("1/1", (1, 1)), ("2/4", (2, 4)), (" 3 / 4 ", (3, 4)), ("10/12", (10, 12))])
def test_parse_shard(text: str, kn: tuple[int, int]) -> None:
    assert parse_shard(text) == kn


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0/4", "K must be between 1 and N=4 (shards are numbered from 1), found 0"),
        ("5/4", "K must be between 1 and N=4"),
        ("1/0", "N must be at least 1"),
        ("-1/4", "expected K/N"),
        ("2", "expected K/N"),
        ("a/b", "expected K/N"),
        ("1/4/2", "expected K/N"),
        ("1.0/4", "expected K/N"),
        ("", "expected K/N"),
    ],
)
def test_parse_shard_errors(text: str, problem: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_shard(text)
    assert str(exc.value).startswith(f"--shard {text!r}: ")
    assert problem in str(exc.value)


@pytest.mark.parametrize(("k", "n"), [(0, 3), (4, 3), (1, 0)])
def test_select_shard_rejects_bad_k_n(k: int, n: int) -> None:
    with pytest.raises(InputError):
        select_shard(IDS, k, n)


# --------------------------------------------------------------------------- merging


def header(role: str = "candidate", **changes: Any) -> TraceHeader:
    base: dict[str, Any] = {
        "role": role,
        "model": "org/tiny",
        "top_k": 2,
        "engine": {"name": "hf", "version": "4.56", "options": {"dtype": "bfloat16"}},
        "extra": {"created_at": "2025-01-01T00:00:00Z", "dtype": "bfloat16"},
    }
    base.update(changes)
    return TraceHeader(**base)


def rec(pid: str) -> PromptRecord:
    n = sum(map(ord, pid)) % 5 + 1
    return PromptRecord(
        id=pid,
        prompt_token_ids=(1, 2, 3),
        token_ids=tuple(range(10, 10 + n)),
        top_logprobs=[[[10 + j, -0.5], [99, -1.5]] for j in range(n)],
        finish_reason="length",
    )


def shard_trace(k: int, n: int, *, ids: list[str] = IDS, label: bool = False, **hdr: Any) -> Trace:
    h = header(**hdr)
    if label:
        h = TraceHeader(h.role, h.model, h.top_k, h.engine, {**h.extra, "shard": f"{k}/{n}"})
    return Trace(h, tuple(rec(i) for i in select_shard(ids, k, n)), path=f"shard{k}.jsonl")


def test_merge_restores_the_suite_in_its_order() -> None:
    shards = [shard_trace(k, 3) for k in (3, 1, 2)]
    merged = merge_traces(shards, IDS)
    assert [r.id for r in merged.records] == IDS
    assert merged.records == tuple(rec(i) for i in IDS)
    assert merged.header.role == "candidate" and merged.header.model == "org/tiny"
    assert [o["path"] for o in merged.header.extra["merged_from"]] == ["shard3.jsonl", "shard1.jsonl", "shard2.jsonl"]
    assert sum(o["prompts"] for o in merged.header.extra["merged_from"]) == len(IDS)


def test_merge_without_expected_ids_keeps_the_given_order() -> None:
    shards = [shard_trace(k, 2) for k in (2, 1)]
    merged = merge_traces(shards)
    assert [r.id for r in merged.records] == select_shard(IDS, 2, 2) + select_shard(IDS, 1, 2)


def test_merge_rejects_overlap() -> None:
    a, b = shard_trace(1, 2), shard_trace(2, 2)
    b = Trace(b.header, (*b.records, a.records[0]), path=b.path)
    with pytest.raises(InputError) as exc:
        merge_traces([a, b], IDS)
    assert str(exc.value) == (
        f"shard2.jsonl: prompt {a.records[0].id!r} is also in shard1.jsonl: shards must not overlap"
    )


def test_merge_rejects_gaps() -> None:
    shards = [shard_trace(k, 3) for k in (1, 3)]
    missing = select_shard(IDS, 2, 3)
    with pytest.raises(InputError) as exc:
        merge_traces(shards, IDS)
    msg = str(exc.value)
    assert msg.startswith(f"{len(missing)} prompt(s) of the suite are in no shard: {missing[0]!r}")
    assert "and " in msg and "more" in msg


def test_merge_rejects_a_prompt_outside_the_suite() -> None:
    shards = [shard_trace(k, 2) for k in (1, 2)]
    with pytest.raises(InputError, match=r"1 prompt\(s\) in the shards are not in the suite: 'prompt-039'"):
        merge_traces(shards, IDS[:-1])


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"role": "oracle"}, "role"),
        ({"model": "org/other"}, "model"),
        ({"top_k": 5}, "top_k"),
        ({"engine": {"name": "vllm", "version": "4.56", "options": {"dtype": "bfloat16"}}}, "engine.name"),
        ({"engine": {"name": "hf", "version": "4.57", "options": {"dtype": "bfloat16"}}}, "engine.version"),
        ({"engine": {"name": "hf", "version": "4.56", "options": {"dtype": "float16"}}}, "engine.options"),
        ({"engine": {"name": "hf", "version": "4.56"}}, "engine.options"),
        ({"extra": {"dtype": "float32"}}, "dtype"),
        ({"extra": {"dtype": "bfloat16", "weights_sha256": "abc"}}, "weights_sha256"),
    ],
)
def test_merge_rejects_mismatched_provenance(changes: dict[str, Any], field: str) -> None:
    odd = shard_trace(2, 2, **changes)
    with pytest.raises(InputError) as exc:
        merge_traces([shard_trace(1, 2), odd], IDS)
    assert str(exc.value).startswith(f"shard2.jsonl: header field '{field}' is ")
    assert "shard1.jsonl has" in str(exc.value)


def test_merge_accepts_what_differs_between_honest_shards() -> None:
    a = shard_trace(1, 2)
    b = shard_trace(2, 2, extra={"created_at": "2025-02-02T00:00:00Z", "dtype": "bfloat16", "hostname": "node7"})
    merged = merge_traces([a, b], IDS)
    assert merged.header.extra["created_at"] == "2025-01-01T00:00:00Z"


def test_merge_checks_shard_labels() -> None:
    good = [shard_trace(k, 3, label=True) for k in (1, 2, 3)]
    merged = merge_traces(good)
    assert "shard" not in merged.header.extra
    assert [o["shard"] for o in merged.header.extra["merged_from"]] == ["1/3", "2/3", "3/3"]

    with pytest.raises(InputError, match=r"shard\(s\) 2/3 missing: a merge needs all 3 shards"):
        merge_traces([good[0], good[2]])
    with pytest.raises(InputError, match=r"shard2\.jsonl: shard 2/3 again \(also shard2\.jsonl\)"):
        merge_traces([good[0], good[1], good[1]])
    wrong = Trace(good[1].header, good[0].records, path="wrong.jsonl")
    with pytest.raises(InputError, match=r"wrong\.jsonl: holds prompt\(s\) .* that belong to other shards than 2/3"):
        merge_traces([good[0], wrong, good[2]])
    with pytest.raises(InputError, match=r"N is \[2, 3\]"):
        merge_traces([good[0], shard_trace(2, 2, label=True)])
    with pytest.raises(InputError, match="header has no 'shard' field"):
        merge_traces([good[0], shard_trace(2, 3), good[2]])


def test_merge_of_nothing() -> None:
    with pytest.raises(InputError, match="no shard traces"):
        merge_traces([])


# --------------------------------------------------------------------------- gate merge


def gate(argv: list[str]) -> tuple[int, str]:
    """The real entry point in-process: (exit code, stderr)."""
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(argv)
    code = exc.value.code
    return (code if isinstance(code, int) else 1), err.getvalue()


def write(path: Path, trace: Trace) -> Path:
    path.write_bytes(encode_trace(trace.header, trace.records))
    return path


def oracle_for(ids: list[str]) -> Trace:
    return Trace(header("oracle", engine={"name": "vllm", "version": "0.11.0"}), tuple(rec(i) for i in ids))


@pytest.fixture
def shard_files(tmp_path: Path) -> list[Path]:
    return [write(tmp_path / f"shard{k}.jsonl", shard_trace(k, 3, label=True)) for k in (1, 2, 3)]


def test_gate_merge_then_compare_equals_the_unsharded_run(tmp_path: Path, shard_files: list[Path]) -> None:
    oracle = write(tmp_path / "oracle.jsonl", oracle_for(IDS))
    whole = write(tmp_path / "whole.jsonl", Trace(header(), tuple(rec(i) for i in IDS)))
    out = tmp_path / "merged.jsonl"
    code, err = gate(["merge", *map(str, shard_files), "-o", str(out), "--expect-ids-from", str(oracle)])
    assert code == 0, err
    assert f"merged 3 shard traces, {len(IDS)} prompts, into {out}" in err
    merged = read_trace(out, role="candidate")
    assert [r.id for r in merged.records] == IDS

    reports = []
    for cand in (whole, out):
        buf = io.StringIO()
        real = sys.stdout
        sys.stdout = buf
        try:
            code, err = gate(["compare", str(oracle), str(cand), "--format", "json"])
        finally:
            sys.stdout = real
        assert code == 0, err
        reports.append(orjson.loads(buf.getvalue()))
    assert reports[0] == reports[1]


def test_gate_merge_refuses_to_overwrite_without_force(tmp_path: Path, shard_files: list[Path]) -> None:
    out = tmp_path / "merged.jsonl"
    precious = shard_files[0].read_bytes()  # a trace: the kind merge writes
    out.write_bytes(precious)
    code, err = gate(["merge", *map(str, shard_files), "-o", str(out)])
    assert code == 2, err
    assert "already exists; pass --force" in err
    assert out.read_bytes() == precious

    code, err = gate(["merge", *map(str, shard_files), "-o", str(out), "--force"])
    assert code == 0, err
    kept = list(tmp_path.glob("merged.jsonl.bak-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == precious
    assert f"kept as {kept[0]}" in err
    assert len(read_trace(out).records) == len(IDS)


def test_gate_merge_finds_a_gap_against_the_oracle(tmp_path: Path, shard_files: list[Path]) -> None:
    oracle = write(tmp_path / "oracle.jsonl", oracle_for(IDS))
    out = tmp_path / "merged.jsonl"
    argv = ["merge", str(shard_files[0]), str(shard_files[2]), "-o", str(out), "--expect-ids-from", str(oracle)]
    code, err = gate(argv)
    assert code == 2, err
    assert f"are in no shard: {select_shard(IDS, 2, 3)[0]!r}" in err
    assert f"the oracle trace {oracle}" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_gate_merge_rejects_an_oracle_of_another_model(tmp_path: Path, shard_files: list[Path]) -> None:
    other = oracle_for(IDS)
    other = Trace(TraceHeader("oracle", "org/other", 2, other.header.engine), other.records)
    oracle = write(tmp_path / "oracle.jsonl", other)
    argv = ["merge", *map(str, shard_files), "-o", str(tmp_path / "m.jsonl"), "--expect-ids-from", str(oracle)]
    code, err = gate(argv)
    assert code == 2, err
    assert "is an oracle for 'org/other', the shards are for 'org/tiny'" in err


def test_gate_merge_reports_bad_shards_as_input_errors(tmp_path: Path, shard_files: list[Path]) -> None:
    shard_files[1].write_bytes(shard_files[1].read_bytes()[:-20])  # a shard cut short
    code, err = gate(["merge", *map(str, shard_files), "-o", str(tmp_path / "m.jsonl")])
    assert code == 2, err
    assert f"{shard_files[1]}:" in err and "truncated" in err


def test_gate_merge_options_exclude_each_other(tmp_path: Path, shard_files: list[Path]) -> None:
    code, err = gate(
        [
            "merge",
            *map(str, shard_files),
            "-o",
            str(tmp_path / "m.jsonl"),
            "--pin-model",
            "org/tiny",
            "--expect-ids-from",
            str(shard_files[0]),
        ]
    )
    assert code == 2, err
    assert "give one" in err


def _pin_folder(root: Path, ids: list[str]) -> Path:
    folder = root / "org" / "tiny"
    folder.mkdir(parents=True)
    lines = [orjson.dumps({"id": i, "text": f"prompt {i}", "max_tokens": 4}) for i in ids]
    (folder / "suite.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return folder


def test_gate_merge_against_the_pins_suite(tmp_path: Path, shard_files: list[Path]) -> None:
    pins = tmp_path / "pins"
    _pin_folder(pins, list(reversed(IDS)))
    out = tmp_path / "merged.jsonl"
    argv = ["merge", *map(str, shard_files), "-o", str(out), "--model", "org/tiny", "--pins-dir", str(pins)]
    code, err = gate(argv)
    assert code == 0, err
    assert [r.id for r in read_trace(out).records] == list(reversed(IDS)), "the suite's order"

    code, err = gate([*argv[:-4], "--pin-model", "org/other", "--pins-dir", str(pins), "--force"])
    assert code == 2, err
    assert "no pin folder for org/other" in err


def test_gate_merge_against_a_changed_suite(tmp_path: Path) -> None:
    from gate.core.pins.oracle_settings import read_settings
    from gate.core.pins.pin import find_folder, load_suite

    pins = tmp_path / "pins"
    _pin_folder(pins, IDS)
    folder = find_folder("org/tiny", pins)
    sha = load_suite(folder, read_settings(folder.settings_path)).sha256
    files = []
    for k in (1, 2):
        t = shard_trace(k, 2)
        stale = TraceHeader(
            t.header.role,
            t.header.model,
            t.header.top_k,
            t.header.engine,
            {**t.header.extra, "pin_suite_sha256": sha if k == 1 else "0" * 64},
        )
        files.append(write(tmp_path / f"s{k}.jsonl", Trace(stale, t.records)))
    out = str(tmp_path / "m.jsonl")
    code, err = gate(["merge", *map(str, files), "-o", out, "--pin-model", "org/tiny", "--pins-dir", str(pins)])
    assert code == 2, err
    assert "header field 'pin_suite_sha256'" in err  # the shards disagree with each other

    files[1].write_bytes(files[0].read_bytes().replace(sha.encode(), b"f" * 64).split(b"\n", 1)[0] + b"\n")
    code, err = gate(
        ["merge", str(files[1]), "-o", str(tmp_path / "m.jsonl"), "--pin-model", "org/tiny", "--pins-dir", str(pins)]
    )
    assert code == 2, err
    assert "the suite changed since; rerun the shards" in err
