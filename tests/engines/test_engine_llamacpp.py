"""The llama.cpp engine: its two greedy paths on a tiny tie GGUF written at test time, forced
decode through the KV cache, faults (missing, corrupt, unloadable GGUF), and, marked slow,
the embedded default's own Q4_1 GGUF against its pin."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

from helpers.gate_cli import invoke
from helpers.tiny_gguf import BOS_ID, TIE_HIGH, TIE_LOW, build_tie_gguf

from gate.core.engine import PromptInput
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.engines.llamacpp.engine import LlamaCppEngine
from gate.errors import EngineError, InputError

TOP_K = 4
PROMPTS = (
    PromptInput("a", (BOS_ID, TIE_LOW - 3, TIE_LOW - 1), 6),
    PromptInput("b", (TIE_HIGH + 2,), 5),
    PromptInput("c", (BOS_ID, 280, 281, 282, 283), 4),
)


@pytest.fixture(scope="module")
def tie_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tie_gguf(tmp_path_factory.mktemp("gguf") / "tie.gguf")


@pytest.fixture(scope="module")
def greedy(tie_gguf: Path) -> Iterator[LlamaCppEngine]:
    engine = LlamaCppEngine("tiny", model_path=str(tie_gguf), n_ctx=64)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def argmax(tie_gguf: Path) -> Iterator[LlamaCppEngine]:
    engine = LlamaCppEngine("tiny", model_path=str(tie_gguf), n_ctx=64, sampler="ggml_argmax")
    yield engine
    engine.close()


def trace(role: str, records: Sequence[PromptRecord], top_k: int = TOP_K) -> Trace:
    return Trace(TraceHeader(role, "tiny", top_k, {"name": "llamacpp", "version": "test"}), tuple(records))


def with_forced(engine: LlamaCppEngine, oracle: Sequence[PromptRecord]) -> list[PromptRecord]:
    records = engine.generate([PromptInput(o.id, o.prompt_token_ids, len(o.token_ids)) for o in oracle], TOP_K)
    return [
        replace(c, forced_token_ids=engine.force(o.prompt_token_ids, o.token_ids, TOP_K).token_ids)
        for c, o in zip(records, oracle, strict=True)
    ]


# --------------------------------------------------------------------------- the two greedy paths


def test_every_position_of_the_tie_gguf_is_an_exact_tie(greedy: LlamaCppEngine) -> None:
    for rec in greedy.generate(PROMPTS, TOP_K):
        assert rec.top_logprobs is not None and len(rec.top_logprobs) == len(rec.token_ids)
        for top in rec.top_logprobs:
            assert [top[0][0], top[1][0]] == [TIE_LOW, TIE_HIGH]
            assert top[0][1] == top[1][1]  # bit for bit
            assert top[2][1] < top[1][1]


@pytest.mark.parametrize(("sampler", "winner"), [("greedy", TIE_LOW), ("ggml_argmax", TIE_HIGH)])
def test_host_greedy_takes_the_lowest_id_and_ggml_argmax_the_highest(
    request: pytest.FixtureRequest, sampler: str, winner: int
) -> None:
    """llama.cpp's host greedy sampler keeps the first maximum (`logit > best`); ggml's CPU
    argmax op keeps the last (`if (max == x[i]) idx = i`)."""
    engine: LlamaCppEngine = request.getfixturevalue("greedy" if sampler == "greedy" else "argmax")
    records = engine.generate(PROMPTS, TOP_K)
    assert {t for r in records for t in r.token_ids} == {winner}
    assert engine.info()["tie_break"] == ("lowest_id" if winner == TIE_LOW else "highest_id")


def test_gate_ratifies_ggml_argmax_as_exact_ties_toward_the_higher_id(
    greedy: LlamaCppEngine, argmax: LlamaCppEngine
) -> None:
    oracle = greedy.generate(PROMPTS, TOP_K)
    same = compare(trace("oracle", oracle), trace("candidate", with_forced(greedy, oracle)))
    assert same.verdict == "strict_pass"
    result = compare(trace("oracle", oracle), trace("candidate", with_forced(argmax, oracle), top_k=0))
    assert result.verdict == "ratified_pass"
    assert result.counts["exact_ties"] == sum(len(o.token_ids) for o in oracle)  # forced: every position
    assert result.counts["defects"] == 0
    assert {(d.cls, d.tie_break) for d in result.divergences} == {("exact_tie", "higher_id")}


@pytest.mark.parametrize("fixture", ["greedy", "argmax"])
def test_forced_decode_on_its_own_tokens_reproduces_generate(request: pytest.FixtureRequest, fixture: str) -> None:
    engine: LlamaCppEngine = request.getfixturevalue(fixture)
    for rec in engine.generate(PROMPTS, TOP_K):
        forced = engine.force(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.token_ids == rec.token_ids
        assert forced.mode == "decode"
        assert forced.top_logprobs == rec.top_logprobs


def test_the_context_limit_is_an_input_error(greedy: LlamaCppEngine) -> None:
    with pytest.raises(InputError, match="raise --engine-opt n_ctx"):
        greedy.generate([PromptInput("long", (BOS_ID,) * 60, 10)], TOP_K)


def test_provenance_names_the_gguf_and_the_build(greedy: LlamaCppEngine, tie_gguf: Path) -> None:
    from gate.core.storage.files import file_sha256

    info = greedy.info()
    assert info["gguf_sha256"] == file_sha256(tie_gguf)
    assert info["name"] == "llamacpp" and info["version"]
    assert info["threads"] == 1 and info["n_batch"] == 64 and info["n_ubatch"] == 64 and info["n_ctx"] == 64
    assert "AVX" in info["system_info"] or info["machine"] != "x86_64"
    assert "weights_sha256" not in info  # not the pin's weights: no provenance check on them


def test_a_trace_header_names_the_gguf_without_this_machines_folders(
    greedy: LlamaCppEngine, tie_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    from types import SimpleNamespace
    from typing import cast

    from gate.core.pins.pin import Pin
    from gate.workflows.run.core import candidate_header

    monkeypatch.setenv("HOME", str(tie_gguf.parent.parent))
    pin = cast(Pin, SimpleNamespace(model="tiny", suite=SimpleNamespace(sha256="0" * 64)))
    engine = candidate_header(pin, greedy.info(), TOP_K).engine
    assert engine["gguf"] == f"~/{tie_gguf.parent.name}/tie.gguf"
    assert not [v for v in engine.values() if isinstance(v, str) and os.path.isabs(v)], engine


# --------------------------------------------------------------------------- faults


def _bad_vocab_gguf(path: Path) -> Path:
    """A SentencePiece vocabulary without byte tokens: llama.cpp throws a C++ exception
    nothing catches while loading it (abort)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(0)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>", b"a"])
    w.add_token_scores([0.0] * 4)
    w.add_token_types([2, 3, 3, 1])
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fault_errors_in_the_engine(tmp_path: Path, tie_gguf: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        LlamaCppEngine("tiny", model_path=str(tmp_path / "missing.gguf"))
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(InputError, match="is not a GGUF file"):
        LlamaCppEngine("tiny", model_path=str(tmp_path / "text.gguf"))
    (tmp_path / "cut.gguf").write_bytes(tie_gguf.read_bytes()[:4096])
    with pytest.raises(EngineError, match=r"llama\.cpp cannot load"):
        LlamaCppEngine("tiny", model_path=str(tmp_path / "cut.gguf"))
    with pytest.raises(EngineError, match=r"it aborted \(SIGABRT\)"):
        LlamaCppEngine("tiny", model_path=str(_bad_vocab_gguf(tmp_path / "vocab.gguf")))


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        ("missing", 2, "does not exist"),
        ("text", 2, "is not a GGUF file"),
        ("truncated", 3, "llama.cpp cannot load"),
        ("abort", 3, "it aborted (SIGABRT)"),
        ("option", 2, "--engine-opt sampler=argmin: expected one of greedy, ggml_argmax"),
    ],
)
def test_faults_through_gate_run_are_one_line(
    tmp_path: Path, tie_gguf: Path, make: str, code: int, message: str
) -> None:
    path = tmp_path / "model.gguf"
    opts = ["--engine-opt", f"model_path={path}"]
    if make == "text":
        path.write_text("not a model")
    elif make == "truncated":
        path.write_bytes(tie_gguf.read_bytes()[:4096])
    elif make == "abort":
        _bad_vocab_gguf(path)
    elif make == "option":
        path.write_bytes(tie_gguf.read_bytes())
        opts += ["--engine-opt", "sampler=argmin"]
    r = invoke(["run", "--engine", "llamacpp", *opts])
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.output


# --------------------------------------------------------------------------- the default model (slow)


@pytest.fixture(scope="module")
def default_q4() -> Iterator[LlamaCppEngine]:
    pytest.importorskip("transformers")
    from gate.models.default import DEFAULT_MODEL, materialize_default

    # Built first: the engine reads the GGUF the pin's weights came from in its manifest
    # (on a fresh machine no earlier test need have built it).
    materialize_default()
    engine = LlamaCppEngine(DEFAULT_MODEL)
    yield engine
    engine.close()


@pytest.mark.slow
def test_the_default_gguf_tokenizes_every_pinned_prompt_as_the_pin(default_q4: LlamaCppEngine) -> None:
    """llama.cpp's tokenizer and the GGUF's chat template give the pin's prompt ids (text
    and chat prompts), and the default pin was dequantised from this very file."""
    from gate.core.pins.pin import load_pin
    from gate.workflows.common.provenance import check_prompt_tokens as check_prompt_ids

    pin = load_pin(default_q4.model_id, Path(__file__).parents[2] / "oracle_pins")
    check_prompt_ids(default_q4, pin)
    assert any(sp.messages_dicts() for sp in pin.suite)  # chat prompts are among them
    assert default_q4.info()["pin_weights_dequantised_from_this_gguf"] is True


@pytest.mark.slow
def test_the_default_gguf_forced_decode_reproduces_generate(default_q4: LlamaCppEngine) -> None:
    ids = default_q4.encode("The capital of France is")
    assert ids is not None
    rec = default_q4.generate([PromptInput("p", ids, 12)], 5)[0]
    assert len(rec.token_ids) == 12 and rec.tokens is not None and "Paris" in "".join(rec.tokens)
    forced = default_q4.force(ids, rec.token_ids, 5)
    assert forced.token_ids == rec.token_ids and forced.top_logprobs == rec.top_logprobs
    # Fed another first token, position 1 sees another context: its list must move.
    other = (rec.token_ids[0] + 1, *rec.token_ids[1:])
    moved = default_q4.force(ids, other, 5)
    assert moved.top_logprobs is not None and rec.top_logprobs is not None
    assert moved.top_logprobs[0] == rec.top_logprobs[0] and moved.top_logprobs[1] != rec.top_logprobs[1]


@pytest.mark.slow
def test_gate_run_llamacpp_on_a_shard_of_the_default_pin(tmp_path: Path) -> None:
    """The quantised build against the pin of its dequantised weights: a report, never an
    input or engine error; the forced data adjudicates every diverging position."""
    import json

    out = tmp_path / "report.json"
    r = invoke(["run", "--engine", "llamacpp", "--shard", "1/8", "--format", "json", "--output", str(out)])
    assert r.exit_code in (0, 1), r.output
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert counts["prompts"] == 5 and counts["positions"] == 160
    assert counts["unadjudicated_positions"] == 0
    assert {d["source"] for d in report["divergences"]} <= {"free_run", "forced"}
