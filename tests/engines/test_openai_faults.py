"""The HTTP engine against a server that misbehaves: each fault is one clear EngineError
(exit 3) naming the URL, retried where a retry can help, and the API key never leaks.

The engine-level tests check the message and the retry count; the `gate run` tests check
what a person sees: exit 3 and one line on stderr, no report, no key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.fake_openai_server import FakeModel, FakeOpenAIServer, Reply, write_fake_pin
from helpers.gate_cli import invoke
from helpers.vllm_server import free_port
from typer.testing import Result

from gate.core.engine import ForcedDecodeUnavailable, PromptInput
from gate.engines.http.openai import OpenAIEngine
from gate.errors import EngineError, InputError

KEY_ENV = "GATE_TEST_OPENAI_KEY"
KEY = "sk-gate-test-3f9c1e7d-SECRET"
PROMPTS = [PromptInput("p0", (11, 12, 13), 4), PromptInput("p1", (21, 22), 4)]


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def engine(url: str, **opts: str) -> OpenAIEngine:
    base = {"model": "fake/model", "api_key_env": KEY_ENV, "retries": "2", "backoff": "0.01", "timeout": "5"}
    base.update(opts)
    return OpenAIEngine("fake/model", base_url=url, **base)


def engine_error(eng: OpenAIEngine, prompts: list[PromptInput] = PROMPTS) -> EngineError:
    with pytest.raises(EngineError) as info:
        eng.generate(prompts, 3)
    err = info.value
    assert err.exit_code == 3
    assert KEY not in str(err)
    assert "\n" not in str(err), "one clear line"
    return err


def test_connection_refused_is_an_engine_failure_naming_the_url(key: str) -> None:
    port = free_port()  # nothing listens there
    eng = engine(f"http://127.0.0.1:{port}", retries="1")
    err = engine_error(eng)
    msg = str(err)
    assert f"http://127.0.0.1:{port}/v1/completions" in msg
    assert "connection refused" in msg
    assert "after 2 attempts" in msg


def test_500s_then_success_is_retried(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(status=500), Reply(status=503))
    eng = engine(server.url, concurrency="1")
    records = eng.generate(PROMPTS[:1], 3)
    assert records[0].token_ids == tuple(server.model.greedy(PROMPTS[0].prompt_token_ids, 4))
    assert len(server.completion_requests()) == 3


def test_500s_past_the_retry_budget_fail(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(status=500), Reply(status=502), Reply(status=500))
    err = engine_error(engine(server.url, concurrency="1", retries="2"), PROMPTS[:1])
    assert "HTTP 500" in str(err) and "after 3 attempts" in str(err)
    assert "scripted failure" in str(err), "the server's own message is quoted"
    assert len(server.completion_requests()) == 3


def test_a_4xx_is_not_retried(server: FakeOpenAIServer, key: str) -> None:
    err = engine_error(OpenAIEngine("x", base_url=server.url, model="no/such-model", retries="3"), PROMPTS[:1])
    assert "HTTP 404" in str(err)
    assert "--engine-opt model=NAME" in str(err)
    assert "does not exist" in str(err)
    assert len(server.completion_requests()) == 1


def test_a_slow_response_past_the_timeout(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(delay=1.5), Reply(delay=1.5))
    start = time.monotonic()
    err = engine_error(engine(server.url, timeout="0.3", retries="1", concurrency="1"), PROMPTS[:1])
    assert time.monotonic() - start < 1.5, "the client gave up at its timeout, not when the server answered"
    assert "no response within 0.3 s" in str(err)
    assert "after 2 attempts" in str(err)


def test_a_slow_response_then_a_fast_one_succeeds(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(delay=1.0))
    records = engine(server.url, timeout="0.3", retries="1", concurrency="1").generate(PROMPTS[:1], 3)
    assert len(records[0].token_ids) == 4


def test_malformed_json(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(body=b'{"choices": [{"logprobs": '))
    err = engine_error(engine(server.url, concurrency="1"), PROMPTS[:1])
    assert "malformed JSON" in str(err)
    assert f"{server.url}/v1/completions" in str(err)
    assert len(server.completion_requests()) == 1, "a malformed answer is not retried"


def test_json_without_choices(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(body=b'{"object": "text_completion"}'))
    err = engine_error(engine(server.url, concurrency="1"), PROMPTS[:1])
    assert "no choices[0]" in str(err)


def test_fewer_tokens_than_asked_without_stop(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(short=2))
    err = engine_error(engine(server.url, concurrency="1"), PROMPTS[:1])
    assert "returned 2 of 4 tokens with finish_reason 'length'" in str(err)
    assert "prompt 'p0'" in str(err)


def test_fewer_tokens_with_stop_is_an_early_stop(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(short=2, finish_reason="stop"))
    (record,) = engine(server.url, concurrency="1").generate(PROMPTS[:1], 3)
    assert len(record.token_ids) == 2
    assert record.finish_reason == "stop"


def test_429_with_retry_after_is_waited_out(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(status=429, headers={"Retry-After": "1"}))
    (record,) = engine(server.url, concurrency="1", backoff="0").generate(PROMPTS[:1], 3)
    assert len(record.token_ids) == 4
    first, second = server.completion_requests()
    assert second.at - first.at >= 0.95, "Retry-After: 1 was honoured"


def test_429_past_the_retry_budget(server: FakeOpenAIServer, key: str) -> None:
    server.queue(*(Reply(status=429, headers={"Retry-After": "0"}) for _ in range(2)))
    err = engine_error(engine(server.url, concurrency="1", retries="1"), PROMPTS[:1])
    assert "HTTP 429" in str(err)


def test_a_dropped_connection_is_retried(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(drop=True))
    (record,) = engine(server.url, concurrency="1").generate(PROMPTS[:1], 3)
    assert len(record.token_ids) == 4
    assert len(server.completion_requests()) == 2


def test_one_failing_prompt_fails_the_batch(server: FakeOpenAIServer, key: str) -> None:
    server.queue(Reply(status=400, body=b'{"error": {"message": "prompt too long"}}'))
    prompts = [PromptInput(f"p{i}", (i + 3,), 2) for i in range(6)]
    err = engine_error(engine(server.url, concurrency="3"), prompts)
    assert "HTTP 400" in str(err) and "prompt too long" in str(err)


def test_the_key_is_sent_but_never_shown(server: FakeOpenAIServer, key: str) -> None:
    # A server that quotes the key back in its error (some proxies do) is scrubbed.
    server.queue(Reply(status=401, body=b'{"error": {"message": "invalid key sk-gate-test-3f9c1e7d-SECRET"}}'))
    eng = engine(server.url, concurrency="1")
    err = engine_error(eng, PROMPTS[:1])
    assert "HTTP 401" in str(err)
    assert f"${KEY_ENV}" in str(err), "the message names the variable"
    assert "[api key]" in str(err)
    (seen,) = server.completion_requests()
    assert seen.headers.get("Authorization") == f"Bearer {KEY}"
    assert KEY not in repr(eng)
    assert KEY not in str(eng.info())


def test_credentials_in_the_base_url_are_never_shown(server: FakeOpenAIServer) -> None:
    url = server.url.replace("http://", "http://user:hunter2@") + "/v1?api-key=hunter2"
    eng = OpenAIEngine("fake/model", base_url=url, retries="0")
    info = eng.info()
    assert "hunter2" not in str(info)
    assert info["base_url"] == f"{server.url}/v1"
    server.queue(Reply(status=500))
    with pytest.raises(EngineError) as exc:
        eng.generate(PROMPTS[:1], 3)
    assert "hunter2" not in str(exc.value)


def test_a_missing_key_variable_is_an_input_error(monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(InputError) as info:
        engine(server.url)
    assert KEY_ENV in str(info.value)
    assert info.value.exit_code == 2


def test_forced_unavailable_when_the_server_ignores_echo(key: str) -> None:
    with FakeOpenAIServer(prompt_logprobs="ignore") as srv:
        eng = engine(srv.url)
        with pytest.raises(ForcedDecodeUnavailable) as info:
            eng.force((5, 6, 7), (8, 9), 3)
    assert "no prompt logprobs" in str(info.value)
    assert info.value.exit_code == 3  # an EngineError, which the runner catches by type
    assert KEY not in str(info.value)


def test_forced_unavailable_when_the_server_refuses_echo(key: str) -> None:
    with FakeOpenAIServer(prompt_logprobs="reject") as srv, pytest.raises(ForcedDecodeUnavailable) as info:
        engine(srv.url).force((5, 6, 7), (8, 9), 3)
    assert "HTTP 400" in str(info.value)
    assert "echo is not supported" in str(info.value)


# --------------------------------------------------------------------------- through `gate run`


def gate_run(pins: Path, url: str, *opts: str, fmt: str = "json") -> Result:
    args = ["run", "--model", "fake/model", "--pins-dir", str(pins), "--engine", "openai", "--format", fmt]
    for opt in (f"base_url={url}", f"api_key_env={KEY_ENV}", "backoff=0", *opts):
        args += ["--engine-opt", opt]
    return invoke(args, env={KEY_ENV: KEY})


def error_line(r: Result) -> str:
    """The one error message on stderr; the key is nowhere in the output."""
    assert KEY not in r.stdout and KEY not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("gate: ")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return errors[0]


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    write_fake_pin(tmp_path / "pins")
    return tmp_path / "pins"


def test_gate_run_passes_a_faithful_server(pins: Path, server: FakeOpenAIServer) -> None:
    r = gate_run(pins, server.url)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["verdict"] == "strict_pass"
    assert report["counts"]["positions_matched"] == report["counts"]["positions"] == 24
    assert all(s.headers.get("Authorization") == f"Bearer {KEY}" for s in server.completion_requests())
    assert KEY not in r.stdout and KEY not in r.stderr


@pytest.mark.parametrize(
    ("fault", "opts", "expect"),
    [
        ("refused", ("retries=1",), "connection refused after 2 attempts"),
        ("500s", ("retries=1",), "HTTP 500 Internal Server Error after 2 attempts: scripted failure"),
        ("slow", ("timeout=0.3", "retries=0"), "no response within 0.3 s (retries=0)"),
        ("malformed", (), "malformed JSON in the HTTP 200 response"),
        ("short", (), "returned 4 of 6 tokens with finish_reason 'length'"),
        ("429s", ("retries=1",), "HTTP 429 Too Many Requests after 2 attempts"),
    ],
)
def test_gate_run_faults_exit_3_with_one_message(
    pins: Path, server: FakeOpenAIServer, fault: str, opts: tuple[str, ...], expect: str
) -> None:
    url = server.url
    replies = {
        "refused": [],
        "500s": [Reply(status=500)] * 8,
        "slow": [Reply(delay=1.0)] * 8,
        "malformed": [Reply(body=b"<html>502 Bad Gateway</html>")] * 8,
        "short": [Reply(short=2)] * 8,
        "429s": [Reply(status=429, headers={"Retry-After": "0"})] * 8,
    }[fault]
    if fault == "refused":
        url = f"http://127.0.0.1:{free_port()}"
    server.queue(*replies)
    r = gate_run(pins, url, "concurrency=1", *opts)
    line = error_line(r)
    assert r.exit_code == 3, r.output
    assert line.startswith(f"gate: error: {url}/v1/completions"), line
    assert expect in line, line
    assert r.stdout == "", "no report on stdout when the engine failed"


def test_gate_run_a_wrong_server_fails_with_prefill_forced_data(pins: Path) -> None:
    with FakeOpenAIServer(FakeModel(vocab=499)) as other:
        r = gate_run(pins, other.url)
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail"
    assert report["counts"]["unadjudicated_positions"] == 0, "every position after a divergence was forced"
    forced = [d for d in report["divergences"] if d["source"] == "forced"]
    assert forced and all(d.get("forced_mode") == "prefill" for d in forced)


def test_gate_run_without_prompt_logprobs_leaves_positions_unadjudicated(pins: Path) -> None:
    with FakeOpenAIServer(FakeModel(vocab=499), prompt_logprobs="ignore") as other:
        r = gate_run(pins, other.url)
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert report["counts"]["unadjudicated_positions"] == 4 * 5
    assert all(d["source"] == "free_run" for d in report["divergences"])


@pytest.mark.parametrize(
    ("error", "printed"), [(ConnectionResetError("peer hung up"), False), (KeyError("a bug in the fake"), True)]
)
def test_the_fake_server_prints_its_own_errors_not_a_client_hanging_up(
    error: Exception, printed: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    from helpers.fake_openai_server import QuietServer

    server = QuietServer(("127.0.0.1", 0), object)  # type: ignore[arg-type]
    try:
        try:
            raise error
        except Exception:
            server.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.server_close()
    err = capsys.readouterr().err
    assert ("Exception occurred during processing of request" in err) is printed
    assert (type(error).__name__ in err) is printed
