"""Contradictory or hostile input never passes, and the CLI's edges.

Each test here failed before its fix (RED first). Traces are the valid pair of
test_bad_input with one thing changed; the command runs through the real `main()`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_bad_input import assert_input_error, candidate_lines, encode, gate, oracle_lines

Files = Callable[..., tuple[Path, Path]]


@pytest.fixture
def files(tmp_path: Path) -> Files:
    def write(oracle: Any = None, candidate: Any = None) -> tuple[Path, Path]:
        o, c = tmp_path / "oracle.jsonl", tmp_path / "candidate.jsonl"
        o.write_bytes(encode(oracle_lines() if oracle is None else oracle) if not isinstance(oracle, bytes) else oracle)
        c.write_bytes(
            encode(candidate_lines() if candidate is None else candidate)
            if not isinstance(candidate, bytes)
            else candidate
        )
        return o, c

    return write


def compare(o: Path, c: Path, *extra: str) -> tuple[int, str, str]:
    return gate(["compare", str(o), str(c), "--format", "json", *extra])


# --------------------------------------------------------------------------- 13: small things


def test_an_empty_format_is_refused_not_taken_as_rich(files: Files) -> None:
    o, c = files()
    code, _, err = gate(["compare", str(o), str(c), "--format", ""])
    assert_input_error(code, err, "'--format'", "'' is not one of")


def test_the_role_message_reads_a_candidate(files: Files) -> None:
    o, _ = files()
    code, _, err = gate(["compare", str(o), str(o)])
    assert_input_error(code, err, "expected a candidate trace")
    assert "an candidate" not in err


def test_a_killed_writer_s_temp_file_goes_at_the_next_write_in_its_folder(tmp_path: Path) -> None:
    from gate.core.storage.atomic import atomic_write

    # What a SIGKILLed write of report.json leaves: its full-size temp file, unlocked.
    stale = tmp_path / ".report.json.0123456789ab.tmp"
    stale.write_bytes(b"x" * 4096)
    other_tool = tmp_path / ".report.json.not-ours.tmp"  # not gate's naming: left alone
    other_tool.write_bytes(b"y")
    atomic_write(tmp_path / "other.md", b"hello")  # another target in the same folder
    assert not stale.exists()
    assert other_tool.exists()


# --------------------------------------------------------------------------- 3: nothing to compare


def test_two_header_only_traces_are_an_input_error(files: Files) -> None:
    o, c = files(oracle_lines()[:1], candidate_lines()[:1])
    code, out, err = compare(o, c)
    assert_input_error(code, err, "nothing to compare", str(o))
    assert out == ""


def test_an_oracle_whose_every_continuation_is_empty_is_an_input_error(files: Files) -> None:
    oracle = oracle_lines()
    for rec in oracle[1:]:
        rec["token_ids"], rec["top_logprobs"] = [], []
    cand = candidate_lines()
    for rec in cand[1:]:
        rec["token_ids"] = []
    o, c = files(oracle, cand)
    code, _, err = compare(o, c)
    assert_input_error(code, err, "nothing to compare", "empty")


# --------------------------------------------------------------------------- 2: forced data vs the free run


def _with_forced(forced: dict[str, list[int]]) -> list[dict[str, Any]]:
    cand = candidate_lines()
    for rec in cand[1:]:
        if rec["id"] in forced:
            rec["forced_token_ids"] = forced[rec["id"]]
    return cand


def test_a_forced_defect_where_the_free_run_matched_fails_the_gate(files: Files) -> None:
    import orjson

    # p1's free run matches the oracle (5, 6), but teacher-forced along the very same
    # tokens the candidate picks 7 at position 0: 2,400 mnats below the oracle's 5.
    o, c = files(None, _with_forced({"p1": [7, 6]}))
    for extra in ((), ("--strict",)):
        code, out, err = compare(o, c, *extra)
        assert code == 1, err
        report = orjson.loads(out)
        assert report["counts"]["defects"] == 1
        assert report["verdict"] == "fail"
        p1 = next(p for p in report["prompts"] if p["id"] == "p1")
        assert p1["strict"] is False and p1["ratified"] is False


def test_a_forced_tie_where_the_free_run_matched_is_counted_and_stays_strict(files: Files) -> None:
    import orjson

    # The decision's other half (a guard, not a RED test): a prefill and a decode step are
    # different kernels, so a forced *tie* inside the matched prefix is honest noise. It is
    # counted; the prompt stays strict, as the spec defines strict (its tokens match).
    oracle = oracle_lines()
    oracle[2]["top_logprobs"][0] = [[7, -0.5], [9, -0.5], [4, -1.0]]  # p2 position 0: an exact tie
    o, c = files(oracle, _with_forced({"p2": [9, 8]}))
    code, out, err = compare(o, c, "--strict")
    assert code == 0, err
    report = orjson.loads(out)
    assert report["verdict"] == "strict_pass" and report["counts"]["exact_ties"] == 1
    p2 = next(p for p in report["prompts"] if p["id"] == "p2")
    assert p2["forced_disagrees_with_free_run"] == 1


def test_a_forced_defect_at_the_first_divergence_is_not_hidden_by_a_free_run_tie(files: Files) -> None:
    import orjson

    oracle = oracle_lines()
    oracle[2]["top_logprobs"][0] = [[7, -0.5], [9, -0.5], [4, -1.0]]  # p2 position 0: an exact tie
    cand = candidate_lines()
    cand[2]["token_ids"] = [9, 8]  # the free run takes the tie's other token ...
    cand[2]["forced_token_ids"] = [4, 8]  # ... forced decoding in the same context a 500-mnat defect
    o, c = files(oracle, cand)
    code, out, err = compare(o, c)
    assert code == 1, err
    (div,) = orjson.loads(out)["divergences"]
    assert (div["position"], div["class"], div["candidate_token"]) == (0, "defect", 4)


# --------------------------------------------------------------------------- 1: token_logits


def _oracle_with_logits(logits: dict[str, Any]) -> list[dict[str, Any]]:
    oracle = oracle_lines()
    for rec in oracle[1:]:
        if rec["id"] in logits:
            rec["token_logits"] = logits[rec["id"]]
    return oracle


@pytest.mark.parametrize(
    ("logits", "needle"),
    [
        ([1e30, 20.0], "token_logits[0]"),
        ([20.0, -5000.0], "token_logits[1]"),
        ([20.0, "20"], "token_logits[1]"),
        ([20.0, True], "token_logits[1]"),
        ([20.0], "token_logits"),  # one logit for two positions
        ("20.0", "token_logits"),
    ],
    ids=["astronomic", "huge-negative", "string", "bool", "short", "not-a-list"],
)
def test_implausible_or_inconsistent_token_logits_are_refused(files: Files, logits: Any, needle: str) -> None:
    o, c = files(_oracle_with_logits({"p1": logits}))
    code, _, err = compare(o, c)
    assert_input_error(code, err, "oracle.jsonl:2", needle)


def test_a_plausible_logit_never_widens_a_grid_step_past_the_cap(files: Files) -> None:
    # A tampered logit within the readable range (500) would make one bf16 step 2 nats;
    # with --near-tie-ulps 2 the rank-2 candidate 2,400 mnats down would be a "near tie".
    cand = candidate_lines()
    cand[1]["token_ids"] = [7, 6]
    o, c = files(_oracle_with_logits({"p1": [500.0, 20.0]}), cand)
    code, out, err = compare(o, c, "--near-tie-ulps", "2")
    assert code == 1, out + err


def test_the_grid_step_is_capped() -> None:
    from gate.core.verdict.grid import MAX_GRID_LOGIT, grid_step

    assert grid_step(MAX_GRID_LOGIT * 8, "bfloat16") == grid_step(MAX_GRID_LOGIT * 0.99, "bfloat16") == 0.5
    assert grid_step(1e30, "float16") == 2.0**-4


# --------------------------------------------------------------------------- 5: headers and lists that disagree


def test_lists_longer_than_the_header_s_top_k_are_refused(files: Files) -> None:
    oracle = oracle_lines()
    oracle[0]["top_k"] = 2  # the lists hold 3
    o, c = files(oracle)
    code, _, err = compare(o, c)
    assert_input_error(code, err, "oracle.jsonl:2", "top_logprobs[0]", "top_k")


def test_a_candidate_list_may_add_its_chosen_token_beyond_top_k(files: Files) -> None:
    # vLLM lists the top-k plus the chosen token when that falls outside them: k + 1 is fine
    # for a candidate (a guard for the check above), k + 2 is not.
    cand = candidate_lines()
    cand[0]["top_k"] = 1
    cand[1]["top_logprobs"] = [[[5, -0.1], [7, -2.5]], [[6, -0.25], [5, -1.5]]]
    o, c = files(None, cand)
    assert compare(o, c)[0] == 0
    cand[1]["top_logprobs"][1].append([8, -4.0])
    o, c = files(None, cand)
    code, _, err = compare(o, c)
    assert_input_error(code, err, "candidate.jsonl:2", "top_logprobs[1]", "top_k")


def test_a_candidate_with_top_k_0_but_lists_is_refused(files: Files) -> None:
    cand = candidate_lines()
    cand[1]["top_logprobs"] = [[[5, -0.1]], [[6, -0.25]]]
    o, c = files(None, cand)
    code, _, err = compare(o, c)
    assert_input_error(code, err, "candidate.jsonl:2", "top_logprobs", "top_k")


@pytest.mark.parametrize("role", ["oracle", "candidate"])
def test_top_k_probabilities_adding_up_to_more_than_one_are_refused(files: Files, role: str) -> None:
    twenty = [[t, -1e-4] for t in range(20)]  # twenty tokens at probability 0.9999 each: 20
    oracle, cand = oracle_lines(), candidate_lines()
    if role == "oracle":
        oracle[0]["top_k"] = 20
        oracle[1]["token_ids"], oracle[1]["top_logprobs"] = [0, 6], [twenty, [[6, -0.25], [5, -1.5]]]
        cand[1]["token_ids"] = [0, 6]
    else:
        cand[0]["top_k"] = 20
        cand[1]["top_logprobs"] = [twenty, [[6, -0.25]]]
    o, c = files(oracle, cand)
    code, _, err = compare(o, c)
    assert_input_error(code, err, f"{role}.jsonl:2", "top_logprobs[0]", "add up to")


def test_a_float32_top_k_adding_up_to_one_is_accepted(files: Files) -> None:
    # The default pin's lists reach 1.000000026 (float32 rounding): that must read.
    oracle, cand = oracle_lines(), candidate_lines()
    oracle[0]["top_k"] = 2
    for rec in oracle[1:]:
        rec["top_logprobs"] = [[[t, -1e-8], [99, -20.0]] for t in rec["token_ids"]]
    o, c = files(oracle, cand)
    assert compare(o, c)[0] == 0


def test_different_model_names_are_a_warning_in_the_report(files: Files) -> None:
    import orjson

    cand = candidate_lines()
    cand[0]["model"] = "org/tiny-AWQ"
    o, c = files(None, cand)
    code, out, err = compare(o, c)
    assert code == 0, err
    (warning,) = orjson.loads(out)["warnings"]
    assert "org/tiny-AWQ" in warning and "org/tiny" in warning
    code, out, err = gate(["compare", str(o), str(c), "--format", "markdown"])
    assert "org/tiny-AWQ" in out


def test_different_tokenizers_are_an_input_error(files: Files) -> None:
    oracle, cand = oracle_lines(), candidate_lines()
    oracle[0]["tokenizer_sha256"] = "a" * 64
    cand[0]["engine"]["tokenizer_sha256"] = "b" * 64
    o, c = files(oracle, cand)
    code, _, err = compare(o, c)
    assert_input_error(code, err, "tokenizer_sha256", "a" * 12, "b" * 12)


# --------------------------------------------------------------------------- 4: duplicate keys


def _lines_bytes(lines: list[dict[str, Any]], line: int, raw: bytes) -> bytes:
    import orjson

    out = [orjson.dumps(x) for x in lines]
    out[line - 1] = raw
    return b"\n".join(out) + b"\n"


@pytest.mark.parametrize(
    ("which", "raw", "needle"),
    [
        ("candidate", b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids":[9,9],"token_ids":[5,6]}', "token_ids"),
        ("candidate", b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids" : [9,9], "token_ids":[5,6]}', "token_ids"),
        (
            "oracle",
            b'{"gate_trace":1,"role":"candidate","role":"oracle","model":"org/tiny","top_k":3,'
            b'"engine":{"name":"vllm","version":"0.11.0"}}',
            "role",
        ),
        (
            "oracle",
            b'{"gate_trace":1,"role":"oracle","model":"org/tiny","top_k":3,'
            b'"engine":{"name":"x","name":"vllm","version":"0.11.0"}}',
            "name",
        ),
        ("candidate", b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids":[5,6],"meta":[{"a":1,"a":2}]}', "a"),
    ],
    ids=["record", "record-spaced", "header", "nested-engine", "nested-extra"],
)
def test_duplicate_keys_are_refused(files: Files, which: str, raw: bytes, needle: str) -> None:
    line = 1 if raw.startswith(b'{"gate_trace"') else 2
    if which == "oracle":
        o, c = files(_lines_bytes(oracle_lines(), line, raw))
    else:
        o, c = files(None, _lines_bytes(candidate_lines(), line, raw))
    code, _, err = compare(o, c)
    assert_input_error(code, err, f"{which}.jsonl:{line}", f"'{needle}'", "twice")


def test_keys_that_look_alike_inside_strings_are_not_duplicates(files: Files) -> None:
    # A guard for the fast duplicate check: colons and key-like text inside strings, nested
    # objects with the same key names at different levels.
    raw = (
        b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids":[5,6],"prompt":"Q: \\"token_ids\\": [9]",'
        b'"tokens":["a:",":"],"meta":{"id":"x","sub":{"id":"y"}},"note":"{\\"id\\":1}"}'
    )
    code, _, err = compare(*files(None, _lines_bytes(candidate_lines(), 2, raw)))
    assert code == 0, err


# --------------------------------------------------------------------------- 6: --output


def test_output_never_replaces_a_symlink(files: Files, tmp_path: Path) -> None:
    o, c = files()
    real = tmp_path / "real.json"
    real.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    code, _, err = compare(o, c, "--output", str(link), "--force")
    assert_input_error(code, err, str(link), "symbolic link")
    assert link.is_symlink() and real.read_text() == "keep me"


def test_output_never_replaces_a_special_file(files: Files, tmp_path: Path) -> None:
    o, c = files()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = compare(o, c, "--output", str(fifo), "--force")
    assert_input_error(code, err, str(fifo), "not a regular file")
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_dash_is_stdout(files: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    o, c = files()
    monkeypatch.chdir(tmp_path)
    code, out, err = compare(o, c, "--output", "-")
    assert code == 0, err
    assert '"gate_report"' in out
    assert not (tmp_path / "-").exists()


def test_merge_output_dash_is_stdout(files: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, c = files()
    monkeypatch.chdir(tmp_path)
    code, out, err = gate(["merge", str(c), "--output", "-"])
    assert code == 0, err
    assert out.startswith('{"gate_trace":1') and not (tmp_path / "-").exists()


# --------------------------------------------------------------------------- 7: bounds


@pytest.mark.parametrize("n", [10**12, 10**23])
def test_a_huge_shard_count_is_refused_at_once(files: Files, n: int) -> None:
    import time

    from gate.core.traces.shards import shard_of

    # A shard trace that holds just its own prompt, so nothing else stops the merge early:
    # it used to list the N - 1 missing shards, allocating until memory ran out.
    cand = candidate_lines()[:2]
    cand[0]["shard"] = f"{shard_of('p1', n)}/{n}"
    _, c = files(None, cand)
    started = time.monotonic()
    code, _, err = gate(["merge", str(c), "--output", str(c.with_name("merged.jsonl"))])
    assert_input_error(code, err, "shard", "at most")
    assert time.monotonic() - started < 5


def test_a_shard_option_with_a_huge_count_is_refused() -> None:
    from gate.core.traces.shards import MAX_SHARDS, parse_shard
    from gate.errors import InputError

    assert parse_shard(f"1/{MAX_SHARDS}") == (1, MAX_SHARDS)
    with pytest.raises(InputError, match="at most"):
        parse_shard(f"1/{MAX_SHARDS + 1}")


def test_a_line_that_would_cost_gigabytes_of_memory_is_refused_unparsed(files: Files) -> None:
    # A case seen: 99 MB of nested empty lists took 3.2 GB to parse.
    line = b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids":[5,6],"junk":[' + b"[]," * 33_000_000 + b"[]]}"
    for last in (b"\n", b""):  # the last line, without its newline, goes another way
        o, c = files(None, _lines_bytes(candidate_lines()[:2], 2, line)[:-1] + last)
        code, _, err = compare(o, c)
        assert_input_error(code, err, "candidate.jsonl:2", "memory")


def test_deep_nesting_is_an_input_error(files: Files) -> None:
    line = b'{"id":"p1","prompt_token_ids":[1,2,3],"token_ids":[5,6],"junk":' + b"[" * 5000 + b"]" * 5000 + b"}"
    o, c = files(None, _lines_bytes(candidate_lines(), 2, line))
    code, _, err = compare(o, c)
    assert_input_error(code, err, "candidate.jsonl:2")


# --------------------------------------------------------------------------- 8, 10: one error, one line


def _one_line(err: str, *, hint: bool = False) -> str:
    """The error line; with `hint`, one further real line `hint: ...` (the command to run next)."""
    lines = err.split("\n")
    assert err.endswith("\n") and len(lines) == (3 if hint else 2), repr(err)
    if hint:
        assert lines[1].startswith("hint: gate "), repr(err)
    assert err.startswith("gate: error: "), repr(err)
    assert "╭" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["compare", "--no-such-option", "a", "b"], ("gate compare", "--no-such-option")),
        (["compare", "a"], ("gate compare", "CANDIDATE")),
        (["compare", "a", "b", "--near-tie-mnats", "abc"], ("gate compare", "--near-tie-mnats")),
        (["no-such-command"], ("gate", "no-such-command")),
    ],
    ids=["unknown-option", "missing-argument", "bad-value", "unknown-command"],
)
def test_usage_errors_are_one_line_exit_2(argv: list[str], needles: tuple[str, ...]) -> None:
    code, _, err = gate(argv)
    assert code == 2, err
    line = _one_line(err)
    for needle in needles:
        assert needle in line, (needle, line)


def test_a_path_with_a_newline_stays_on_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "evil\nverdict: strict pass (exit 0).jsonl"
    code, _, err = gate(["compare", str(bad), str(bad)])
    assert code == 2
    assert "\\n" in _one_line(err)


def test_an_unknown_pin_model_is_one_line(files: Files) -> None:
    _, c = files()
    code, _, err = gate(
        ["merge", str(c), "--pin-model", "nope/model", "-o", str(c.with_name("m.jsonl")), "--pins-dir", str(c.parent)]
    )
    assert code == 2
    _one_line(err, hint=True)


def test_ctrl_c_says_so_and_exits_130(files: Files, monkeypatch: pytest.MonkeyPatch) -> None:
    import gate.cli.compare as compare_cli

    def interrupted(**_: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_cli, "compare_files", interrupted)
    o, c = files()
    code, _, err = gate(["compare", str(o), str(c)])
    assert code == 130
    assert err == "gate: interrupted (Ctrl-C)\n"


# --------------------------------------------------------------------------- 9: control characters in reports

EVIL_ID = "p1\x1b[2K\x1b[32mverdict: strict pass\x1b[0m\u202e\r\x9b"
EVIL_TEXT = "tok\x1b]0;title\x07\u2066"
RAW = ("\x1b", "\u202e", "\r", "\x9b", "\x07", "\u2066")


def _evil_result(tmp_path: Path) -> Any:
    from gate.core.traces.reader import read_trace
    from gate.core.verdict.adjudicate import compare as adjudicate

    oracle, cand = oracle_lines(), candidate_lines()
    oracle[1]["id"] = cand[1]["id"] = EVIL_ID
    oracle[1]["tokens"] = [EVIL_TEXT, "b"]
    oracle[1]["prompt"] = EVIL_TEXT
    cand[1]["token_ids"] = [7, 6]  # a divergence, so ids and texts reach every panel and table
    cand[1]["tokens"] = [EVIL_TEXT, "c"]
    cand[0]["model"] = oracle[0]["model"] = "org/\x1b[31mtiny"
    o, c = tmp_path / "o.jsonl", tmp_path / "c.jsonl"
    o.write_bytes(encode(oracle))
    c.write_bytes(encode(cand))
    return adjudicate(read_trace(o), read_trace(c))


@pytest.mark.parametrize("fmt", ["rich", "markdown", "junit", "html"])
def test_human_reports_escape_control_and_bidi_characters(tmp_path: Path, fmt: str) -> None:
    from gate.reports import render

    text = render(_evil_result(tmp_path), fmt)
    for ch in RAW:
        assert ch not in text, (fmt, repr(ch))
    assert "\\x1b" in text or "\\u001b" in text


def test_the_colour_terminal_report_escapes_them_too(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from gate.reports.terminal import print_report

    buf = io.StringIO()
    print_report(_evil_result(tmp_path), Console(file=buf, force_terminal=True, width=120, color_system="truecolor"))
    out = buf.getvalue()
    assert "\x1b[2K" not in out and "\x1b[32mverdict" not in out and "\u202e" not in out and "\x9b" not in out


def test_printable_escapes_what_it_must_and_nothing_else() -> None:
    from gate.text import printable

    assert printable("a\x1b[31mb\u202ec\n\t\x85") == "a\\u001b[31mb\\u202ec\\n\\t\\u0085"
    assert printable("héllo 中文 🙂 ∑") == "héllo 中文 🙂 ∑"
