"""Pins: locating the folder, oracle settings, consistency checks, diffs, `gate pin record`.

The oracle here is the toy engine of `fake_engine.py` (oracle.json `"engine": "fake"`);
the real vLLM recordings are in test_default_pin.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake, toy_pin_folder, write_jsonl

from gate.core.pins.diff import diff_pins, exact_top2_ties
from gate.core.pins.oracle_settings import OracleSettings, read_settings
from gate.core.pins.pin import check_model_id, find_folder, load_pin, pin_folder, search_roots
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.errors import InputError, PinError

REPO = Path(__file__).resolve().parents[2]
QWEN = "Qwen/Qwen3.6-35B-A3B"


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)
    monkeypatch.delenv("GATE_PINS_DIR", raising=False)


# --------------------------------------------------------------------------- locating


@pytest.mark.parametrize("model", ["org/name", "name", "HuggingFaceTB/SmolLM2-135M-Instruct", "a/b/c"])
def test_model_ids_that_stay_inside(model: str) -> None:
    assert check_model_id(model) == model


@pytest.mark.parametrize(
    "model", ["../etc", "org/../../x", "/abs/path", "org//name", "org/./x", "", "  ", "a\\b", "C:/x", "org/"]
)
def test_model_ids_that_would_escape_are_input_errors(model: str) -> None:
    with pytest.raises(InputError, match="--model"):
        check_model_id(model)


def test_cli_refuses_escaping_model_id(tmp_path: Path) -> None:
    r = invoke(["run", "--model", "../../etc", "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "not a model id like 'org/name'" in r.stderr and "'..'" in r.stderr
    r = invoke(["pin", "record", "--model", "/tmp/x", "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "absolute path" in r.stderr


def test_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "pins"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "org").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="leads outside"):
        pin_folder("org/model", root)


def test_search_roots_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert search_roots(tmp_path / "explicit") == [tmp_path / "explicit"]
    monkeypatch.setenv("GATE_PINS_DIR", str(tmp_path / "env"))
    assert search_roots(None) == [tmp_path / "env"]
    assert search_roots(tmp_path / "explicit") == [tmp_path / "explicit"]
    monkeypatch.delenv("GATE_PINS_DIR")
    roots = search_roots(None, cwd=tmp_path)
    assert roots == [tmp_path / "oracle_pins", REPO / "oracle_pins"]


def test_cwd_pins_come_first_and_the_repo_is_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # Nothing under ./oracle_pins: the checkout's own pins are found.
    assert find_folder(QWEN).root == REPO / "oracle_pins"
    toy_pin_folder(tmp_path / "oracle_pins", QWEN)
    assert find_folder(QWEN).root == tmp_path / "oracle_pins"


def test_unknown_model_lists_pinned_ones(tmp_path: Path) -> None:
    toy_pin_folder(tmp_path)
    with pytest.raises(PinError) as info:
        find_folder("nobody/none", tmp_path)
    msg = str(info.value)
    assert "no pin folder for nobody/none" in msg and TOY_MODEL in msg
    assert info.value.hint == f"gate pin record --model nobody/none --pins-dir {tmp_path} --prompts SUITE.jsonl"
    assert "\n" not in msg


# --------------------------------------------------------------------------- the Qwen folder


def test_qwen_folder_has_suite_and_settings_but_no_pin() -> None:
    folder = REPO / "oracle_pins" / "Qwen" / "Qwen3.6-35B-A3B"
    assert (folder / "suite.jsonl").is_file() and not (folder / "pin.jsonl").exists()
    s = read_settings(folder / "oracle.json")
    assert (s.engine, s.dtype, s.model) == ("vllm", "bfloat16", QWEN)
    assert s.tensor_parallel_size * s.pipeline_parallel_size >= 2


def test_gate_run_on_qwen_says_there_is_no_pin_and_how_to_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = invoke(["run", "--model", QWEN])
    assert r.exit_code == 2, r.output
    assert "no recorded pin for Qwen/Qwen3.6-35B-A3B" in r.stderr
    assert "tensor_parallel_size=2" in r.stderr
    assert r.stderr.rstrip().endswith("gate pin record --model Qwen/Qwen3.6-35B-A3B")
    assert r.stdout == ""


# --------------------------------------------------------------------------- settings


def test_settings_defaults_and_overrides(tmp_path: Path) -> None:
    assert read_settings(tmp_path / "none.json") == OracleSettings()
    s = OracleSettings(max_model_len=2048).with_overrides(
        max_tokens=8,
        top_k=5,
        engine_opts={"tensor_parallel_size": "4", "dtype": "float16", "gpu_memory_utilization": "0.8"},
    )
    assert (s.max_tokens, s.top_k, s.tensor_parallel_size, s.dtype) == (8, 5, 4, "float16")
    assert s.engine_kwargs() == {
        "dtype": "float16",
        "tensor_parallel_size": 4,
        "max_model_len": 2048,
        "gpu_memory_utilization": "0.8",
    }
    with pytest.raises(InputError, match="--engine-opt tensor_parallel_size=two: expected an integer"):
        OracleSettings().with_overrides(engine_opts={"tensor_parallel_size": "two"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "bad JSON"),
        ("[1]", "must be a JSON object"),
        ('{"top_k": 0}', "field 'top_k': must be an integer >= 1"),
        ('{"max_tokens": "32"}', "field 'max_tokens': must be an integer >= 1"),
        ('{"tensor_parallel": 2}', "field 'tensor_parallel': unknown setting"),
        ('{"dtype": 16}', "field 'dtype': must be a string"),
        ('{"engine_options": []}', "field 'engine_options': must be an object"),
        ('{"max_model_len": 0}', "field 'max_model_len'"),
        ('{"doctrine": {"near_tie": 2}}', "field 'doctrine.near_tie': unknown"),
        ('{"doctrine": {"near_tie_ulps": -1}}', "field 'doctrine.near_tie_ulps': must be a number >= 0"),
        ('{"doctrine": {"near_tie_mnats": "250"}}', "field 'doctrine.near_tie_mnats': must be a number >= 0"),
        ('{"doctrine": 2}', "field 'doctrine': must be an object"),
    ],
)
def test_bad_settings_name_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "oracle.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message) as info:
        read_settings(path)
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------- diffs and ties


def _oracle(records: dict[str, list[list[list[float]]]]) -> Trace:
    recs = []
    for pid, tops in records.items():
        recs.append(
            PromptRecord(
                id=pid,
                prompt_token_ids=(1, 2),
                token_ids=tuple(int(t[0][0]) for t in tops),
                top_logprobs=[[[int(a), b] for a, b in t] for t in tops],
            )
        )
    header = TraceHeader(role="oracle", model="m", top_k=2, engine={"name": "x", "version": "1"})
    return Trace(header=header, records=tuple(recs))


def test_diff_names_prompts_and_positions_that_moved() -> None:
    old = _oracle({"a": [[[5, -0.1], [6, -2.0]], [[7, -0.5], [8, -0.5]]], "b": [[[1, -0.1], [2, -3.0]]], "gone": []})
    new = _oracle({"a": [[[5, -0.1], [6, -2.5]], [[8, -0.4], [7, -0.6]]], "b": [[[1, -0.1], [2, -3.0]]], "new": []})
    d = diff_pins(old, new)
    assert d.added == ("new",) and d.removed == ("gone",)
    (move,) = d.moved
    assert move.id == "a" and move.first_token_change == 1 and move.token_positions == (1,)
    assert move.logprob_positions == (0, 1)
    text = "\n".join(d.lines())
    assert "1 of 3 prompts moved, 1 added, 1 removed" in text
    assert "a: tokens differ from position 1 (1 positions); logprobs moved at positions 0, 1" in text
    assert diff_pins(old, old).unchanged
    assert diff_pins(old, old).lines() == ["the new pin matches the old one bit for bit (3 prompts)"]


def test_a_logprob_moving_by_one_ulp_is_a_move() -> None:
    import math

    lp = -0.5
    old = _oracle({"a": [[[5, lp], [6, -2.0]]]})
    new = _oracle({"a": [[[5, math.nextafter(lp, 0.0)], [6, -2.0]]]})
    assert diff_pins(old, new).moved[0].logprob_positions == (0,)


def test_a_pin_whose_reference_or_raw_logits_moved_is_not_bit_for_bit() -> None:
    """The oracle's tokens and logprobs equal, its float32 reference's lists (or its raw
    logits) moved by one ulp: the re-recorded pin is not the old one bit for bit (seen: vLLM's
    numbers unchanged on an AVX2-only CPU, transformers' float32 reference moved), and the
    diff names the field that moved, at its positions."""
    import math
    from dataclasses import replace

    lp = -0.5
    tops = {"a": [[[5, lp], [6, -2.0]], [[7, -0.5], [8, -1.0]]], "b": [[[1, -0.1], [2, -3.0]]]}
    base = _oracle(tops)

    def with_extra(trace: Trace, pid: str, token_logits: list[float], **extra: object) -> Trace:
        recs = tuple(replace(r, token_logits=token_logits, extra=extra) if r.id == pid else r for r in trace.records)
        return replace(trace, records=recs)

    ref = [[[5, lp], [6, -2.0]], [[7, -0.5], [8, -1.0]]]
    old = with_extra(base, "a", [3.0, 2.5], reference_top_logprobs=ref)
    moved_ref = [ref[0], [[7, math.nextafter(-0.5, 0.0)], [8, -1.0]]]
    logits, moved_logits = [3.0, 2.5], [math.nextafter(3.0, 4.0), 2.5]
    for new, field, positions in (
        (with_extra(base, "a", logits, reference_top_logprobs=moved_ref), "reference_top_logprobs", "1"),
        (with_extra(base, "a", moved_logits, reference_top_logprobs=ref), "token_logits", "0"),
        (with_extra(base, "a", logits), "reference_top_logprobs", "0, 1"),
    ):
        d = diff_pins(old, new)
        assert not d.unchanged, field
        (move,) = d.moved
        assert move.id == "a" and move.first_token_change is None and move.logprob_positions == ()
        text = "\n".join(d.lines())
        assert "bit for bit" not in text
        assert f"a: {field} moved at positions {positions}" in text, text
    assert diff_pins(old, old).unchanged


def test_exact_top2_ties_are_bitwise() -> None:
    t = _oracle({"a": [[[7, -0.5], [8, -0.5]], [[7, -0.5], [8, -0.5000001]]]})
    (tie,) = exact_top2_ties(t)
    assert (tie.prompt_id, tie.position, tie.chosen, tie.other) == ("a", 0, 7, 8)


# --------------------------------------------------------------------------- gate pin record


def test_record_writes_a_pin_with_provenance(tmp_path: Path) -> None:
    from helpers.fake_engine import FakeEngine

    folder = record_toy_pin(tmp_path)
    trace = read_trace(folder / "pin.jsonl", role="oracle")
    h = trace.header
    assert h.model == TOY_MODEL and h.top_k == 5 and h.engine["name"] == "fake"
    for key in (
        "dtype",
        "device",
        "weights_sha256",
        "tokenizer_sha256",
        "versions",
        "platform",
        "sampling",
        "suite_sha256",
        "prompt_sha256",
        "created_at",
        "oracle",
    ):
        assert key in h.extra, key
    assert h.extra["versions"]["torch"] and h.extra["versions"]["vllm"]
    assert h.extra["sampling"]["temperature"] == 0.0 and h.extra["sampling"]["max_tokens"] == [12]
    pin = load_pin(TOY_MODEL, tmp_path)
    assert h.extra["suite_sha256"] == pin.suite.sha256
    assert set(h.extra["prompt_sha256"]) == set(pin.suite.ids)
    assert next(r.prompt for r in trace.records) == "prompt number 0: import numpy as np"
    # One generate call with every prompt: the batch is part of what makes vLLM reproducible.
    # (The calls after it, one prompt each, are the honest re-run that measures the floor.)
    calls = [c for c in FakeEngine.history if c[0] == "generate"]
    assert calls[0] == ("generate", list(pin.suite.ids))
    assert calls[1:] == [("generate", [i]) for i in pin.suite.ids]
    assert FakeEngine.history[-1] == ("close", None)


def test_record_refuses_to_overwrite_before_loading_the_oracle(tmp_path: Path) -> None:
    from helpers.fake_engine import FakeEngine

    record_toy_pin(tmp_path)
    FakeEngine.history.clear()
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "pin.jsonl exists; pass --force to re-record it" in r.stderr
    assert FakeEngine.history == []


def test_force_shows_what_moved_and_keeps_a_backup(tmp_path: Path) -> None:
    folder = record_toy_pin(tmp_path)
    before = (folder / "pin.jsonl").read_bytes()
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--force"])
    assert r.exit_code == 0, r.output
    assert "the new pin matches the old one bit for bit (6 prompts)" in r.stderr
    r = invoke(
        ["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--force", "--engine-opt", "seed=3"]
    )
    assert r.exit_code == 0, r.output
    assert "against the old pin: 6 of 6 prompts moved" in r.stderr
    assert "p00: tokens differ from position" in r.stderr
    backups = sorted(folder.glob("pin.jsonl.bak-*"))
    assert backups and backups[-1].read_bytes() != (folder / "pin.jsonl").read_bytes()
    assert before in [b.read_bytes() for b in backups]
    # The override is kept in oracle.json, so `gate run` and re-recording see the same settings.
    assert read_settings(folder / "oracle.json").engine_options == {"seed": "3"}


def test_record_from_prompts_file_with_max_tokens_writes_the_resolved_suite(tmp_path: Path) -> None:
    prompts = write_jsonl(
        tmp_path / "mine.jsonl", [{"id": "x", "text": "hello"}, {"id": "y", "text": "world", "max_tokens": 3}]
    )
    settings = tmp_path / "pins" / "new" / "model" / "oracle.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"engine": "fake", "dtype": "toy", "top_k": 3}))
    r = invoke(
        [
            "pin",
            "record",
            "--model",
            "new/model",
            "--pins-dir",
            str(tmp_path / "pins"),
            "--prompts",
            str(prompts),
            "--max-tokens",
            "4",
        ]
    )
    assert r.exit_code == 0, r.output
    pin = load_pin("new/model", tmp_path / "pins")
    assert [len(r.token_ids) for r in pin.trace.records] == [4, 4]
    assert [p.max_tokens for p in pin.suite] == [4, 4]
    assert pin.settings.max_tokens == 4 and pin.settings.model == "new/model"


def test_record_without_suite_is_an_input_error(tmp_path: Path) -> None:
    r = invoke(["pin", "record", "--model", "a/b", "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "no prompt suite" in r.stderr and "--prompts FILE" in r.stderr


def test_record_with_a_bad_suite_names_the_line(tmp_path: Path) -> None:
    folder = toy_pin_folder(tmp_path)
    with (folder / "suite.jsonl").open("a") as fh:
        fh.write('{"id": "p00", "text": "again"}\n')
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "suite.jsonl:7: field 'id': duplicate id 'p00' (first on line 1)" in r.stderr


def test_oracle_crash_while_recording_exits_3(tmp_path: Path) -> None:
    toy_pin_folder(tmp_path, engine_options={"fail": "generate"})
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 3, r.output
    assert "engine 'fake' failed in generate: RuntimeError: toy model crashed in generate" in r.stderr
    assert not (tmp_path / "toy" / "model" / "pin.jsonl").exists()


def test_oracle_that_breaks_the_argmax_rule_is_refused(tmp_path: Path) -> None:
    toy_pin_folder(tmp_path, engine_options={"tie_break": "highest"})
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 3, r.output
    assert "not a valid oracle record" in r.stderr and "torch.argmax" in r.stderr


# --------------------------------------------------------------------------- loading checks


def test_a_suite_edited_after_recording_is_refused(tmp_path: Path) -> None:
    folder = record_toy_pin(tmp_path)
    rows = [json.loads(line) for line in (folder / "suite.jsonl").read_text().splitlines()]
    rows[1]["text"] = "something else"
    write_jsonl(folder / "suite.jsonl", rows)
    with pytest.raises(
        PinError, match=r"has changed since the pin was recorded \(prompts changed, added or removed: p01\)"
    ):
        load_pin(TOY_MODEL, tmp_path)
    r = invoke(["run", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--engine", "fake"])
    assert r.exit_code == 2, r.output
    assert "re-record the pin" in r.stderr


def test_a_pin_in_the_wrong_folder_is_refused(tmp_path: Path) -> None:
    folder = record_toy_pin(tmp_path)
    other = tmp_path / "other" / "model"
    other.mkdir(parents=True)
    for name in ("suite.jsonl", "oracle.json", "pin.jsonl"):
        (other / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(PinError, match=r"the pin is for model 'toy/model', but its folder is for 'other/model'"):
        load_pin("other/model", tmp_path)


def test_pin_show_prints_provenance_and_ties(tmp_path: Path) -> None:
    record_toy_pin(tmp_path)
    r = invoke(["pin", "show", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    pin = load_pin(TOY_MODEL, tmp_path)
    assert out["prompts"] == 6 and out["positions"] == 72
    assert len(out["exact_top2_ties"]) == len(exact_top2_ties(pin.trace)) > 0
