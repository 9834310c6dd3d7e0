"""The HTTP engines bounded and checked, against real servers on 127.0.0.1: a deadline for
the whole response (not per read), a cap on the body before it is parsed, and answers that
contradict themselves or give less than asked refused (exit 3, one line naming the prompt
and position). The faults are scripted on the fake server: no real server shows them."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.fake_openai_server import FakeOpenAIServer, Reply, write_fake_pin
from helpers.fake_openai_server import no_retry_engine as engine
from helpers.gate_cli import invoke

from gate.core.engine import PromptInput
from gate.core.traces.reader import read_trace
from gate.engines.http.llama_server import LlamaServerDialect
from gate.engines.http.openai import OpenAIEngine
from gate.engines.http.server import HTTP_OPTIONS, connect
from gate.errors import EngineError, InputError

PROMPT = PromptInput("p0", (11, 12, 13), 4)


def engine_error(eng: OpenAIEngine, top_k: int = 3) -> str:
    with pytest.raises(EngineError) as info:
        eng.generate([PROMPT], top_k)
    msg = str(info.value)
    assert info.value.exit_code == 3
    assert "\n" not in msg, "one line"
    return msg


def answer(server: FakeOpenAIServer, k: int = 3) -> dict[str, Any]:
    """The honest answer to PROMPT with `logprobs=k`, to be bent by a test."""
    body = {"model": "fake/model", "prompt": list(PROMPT.prompt_token_ids), "max_tokens": PROMPT.max_tokens}
    status, obj = server.answer({**body, "logprobs": k}, None)
    assert status == 200
    return obj


# ------------------------------------------------------------------- the deadline


def test_a_trickled_answer_hits_the_deadline_for_the_whole_response(server: FakeOpenAIServer) -> None:
    # Each byte arrives well within the timeout, the whole body (about 1 kB) never does.
    server.queue(Reply(trickle=0.02))
    start = time.monotonic()
    msg = engine_error(engine(server.url, timeout="0.5"))
    took = time.monotonic() - start
    assert took < 3.0, f"the deadline is per response, not per read (took {took:.1f} s)"
    assert "no response within 0.5 s" in msg
    assert f"{server.url}/v1/completions" in msg


def test_an_answer_within_the_deadline_still_passes(server: FakeOpenAIServer) -> None:
    records = engine(server.url, timeout="5").generate([PROMPT], 3)
    assert records[0].token_ids == tuple(server.model.greedy(PROMPT.prompt_token_ids, 4))


# ------------------------------------------------------------------- the size cap


def test_a_body_past_the_cap_is_refused_before_it_is_read(server: FakeOpenAIServer) -> None:
    server.queue(Reply(body=b'{"pad": "' + b"x" * 300_000 + b'"}'))
    msg = engine_error(engine(server.url, max_response_bytes="100000"))
    assert "larger than the cap of 100000 bytes" in msg
    assert "max_response_bytes" in msg and f"{server.url}/v1/completions (prompt 'p0')" in msg
    assert len(server.completion_requests()) == 1, "not retried: another attempt gets the same answer"


class _Flood:
    """A server that answers any request with `size` bytes and no Content-Length (the body
    ends when it closes): only counting the bytes as they come can stop it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return  # closed unasked
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                chunk = b"[" + b"1," * 32767 + b"1"
                sent = 0
                while sent < self.size:
                    conn.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the client stopped reading: what the cap is for

    def close(self) -> None:
        self.sock.close()


def test_a_body_without_a_length_is_cut_at_the_cap_and_costs_no_more() -> None:
    flood = _Flood(40 * 1024 * 1024)
    try:
        tracemalloc.start()
        msg = engine_error(engine(flood.url, max_response_bytes="1000000"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        flood.close()
    assert "larger than the cap of 1000000 bytes" in msg
    assert peak < 8 * 1024 * 1024, f"reading a 40 MB answer held {peak / 2**20:.0f} MiB"


def test_the_cap_is_an_engine_option_of_every_http_engine() -> None:
    assert "max_response_bytes" in HTTP_OPTIONS
    with pytest.raises(InputError, match="max_response_bytes=0"):
        engine("http://127.0.0.1:9", max_response_bytes="0")


# ------------------------------------------------------------------- self-contradicting answers


def test_fewer_entries_than_asked_is_refused(server: FakeOpenAIServer) -> None:
    obj = answer(server)
    lp = obj["choices"][0]["logprobs"]
    # Position 2 lists only the chosen token: one entry where three were asked.
    lp["top_logprobs"][2] = {lp["tokens"][2]: lp["token_logprobs"][2]}
    server.queue(Reply(body=orjson.dumps(obj)))
    msg = engine_error(engine(server.url))
    assert "(prompt 'p0')" in msg and "position 2" in msg
    assert "1 top-logprob entries where 3 were asked" in msg


def test_a_token_named_twice_in_the_json_is_refused(server: FakeOpenAIServer) -> None:
    obj = answer(server)
    lp = obj["choices"][0]["logprobs"]
    key = lp["tokens"][1]
    raw = orjson.dumps(obj)
    first = orjson.dumps(lp["top_logprobs"][1])
    # The same key twice, with two values: orjson keeps the last, another reader the first.
    bent = first.replace(b"{", b'{"' + key.encode() + b'":-9.5,', 1)
    server.queue(Reply(body=raw.replace(first, bent, 1)))
    msg = engine_error(engine(server.url))
    assert "(prompt 'p0')" in msg and "choices[0].logprobs.top_logprobs[1]" in msg
    assert key in msg and "twice" in msg


def test_one_id_under_two_keys_is_refused(server: FakeOpenAIServer) -> None:
    obj = answer(server)
    lp = obj["choices"][0]["logprobs"]
    tid = int(lp["tokens"][0].split(":")[1])
    lp["top_logprobs"][0][f"token_id:0{tid}"] = -7.0  # "token_id:07" is id 7 too
    server.queue(Reply(body=orjson.dumps(obj)))
    msg = engine_error(engine(server.url))
    assert f"position 0: token {tid} is named twice" in msg and "(prompt 'p0')" in msg


def test_token_logprobs_that_contradict_top_logprobs_are_refused(server: FakeOpenAIServer) -> None:
    obj = answer(server)
    lp = obj["choices"][0]["logprobs"]
    lp["token_logprobs"][3] -= 0.5
    server.queue(Reply(body=orjson.dumps(obj)))
    msg = engine_error(engine(server.url))
    assert "(prompt 'p0')" in msg and "position 3" in msg and "contradicts itself" in msg


def test_an_honest_answer_passes_every_check(server: FakeOpenAIServer) -> None:
    records = engine(server.url).generate([PROMPT], 3)
    assert all(len(top) >= 3 for top in records[0].top_logprobs or [])


def test_a_cap_on_logprobs_below_top_k_records_the_short_lists_as_they_are(server: FakeOpenAIServer) -> None:
    # max_logprobs=1 is the person's own setting, not the server's fault: the lists are
    # kept as short as they came (the header's top_k stays the pin's), never padded.
    records = engine(server.url, max_logprobs="1").generate([PROMPT], 3)
    assert records[0].top_logprobs is not None
    assert all(len(top) == 1 for top in records[0].top_logprobs)


# ------------------------------------------------------------------- another model


def test_a_server_answering_as_another_model_is_reported() -> None:
    with FakeOpenAIServer(answer_model="other/model") as srv:
        eng = engine(srv.url)
        eng.generate([PROMPT], 3)
        late = eng.late_info()
    assert late["answered_models"] == ["other/model"]
    assert "answered as model 'other/model', not 'fake/model'" in late["warnings"][0]


def test_gate_run_puts_the_answered_model_in_the_header_and_warns(tmp_path: Path) -> None:
    write_fake_pin(tmp_path / "pins")
    saved = tmp_path / "cand.jsonl"
    with FakeOpenAIServer(answer_model="other/model") as srv:
        r = invoke(
            [
                "run",
                "--model",
                "fake/model",
                "--pins-dir",
                str(tmp_path / "pins"),
                "--engine",
                "openai",
                "--engine-opt",
                f"base_url={srv.url}",
                "--engine-opt",
                "model=fake/model",
                "--save-trace",
                str(saved),
            ]
        )
    assert r.exit_code in (0, 1), r.output
    assert "warning:" in r.stderr and "'other/model'" in r.stderr
    header = read_trace(saved, role="candidate").header
    assert header.engine["answered_models"] == ["other/model"]


def test_gate_run_with_max_logprobs_below_top_k_keeps_the_pins_top_k(tmp_path: Path) -> None:
    write_fake_pin(tmp_path / "pins", top_k=5)
    saved = tmp_path / "cand.jsonl"
    with FakeOpenAIServer() as srv:
        r = invoke(
            [
                "run",
                "--model",
                "fake/model",
                "--pins-dir",
                str(tmp_path / "pins"),
                "--engine",
                "openai",
                "--engine-opt",
                f"base_url={srv.url}",
                "--engine-opt",
                "max_logprobs=1",
                "--save-trace",
                str(saved),
            ]
        )
    assert r.exit_code in (0, 1), r.output
    cand = read_trace(saved, role="candidate")
    assert cand.header.top_k == 5, "the header says what was asked; the lists say what came"
    assert all(len(top) <= 2 for rec in cand.records for top in rec.top_logprobs or [])


# ------------------------------------------------------------------- llama-server's native API


def _llama_answer(listed: list[dict[str, Any]], chosen: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "tokens": [chosen["id"]],
            "completion_probabilities": [{**chosen, "token": "x", "top_logprobs": listed}],
            "stop_type": "limit",
            "tokens_evaluated": 3,
            "generation_settings": {"samplers": ["temperature"], "temperature": 0},
        }
    )


def _llama_error(server: FakeOpenAIServer, body: bytes) -> str:
    opts = {k: v for k, (_, v) in HTTP_OPTIONS.items()}
    opts.update(retries=0, timeout=5.0)
    _, http = connect("llama-server", server.url, opts)
    dialect = LlamaServerDialect(http, retries=0, forced_mode="decode")
    server.queue(Reply(body=body))
    with pytest.raises(EngineError) as info:
        dialect.generate(PromptInput("p0", (1, 2, 3), 1), 3)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_llama_server_lists_shorter_than_n_probs_are_refused(server: FakeOpenAIServer) -> None:
    listed = [{"id": 5, "logprob": -0.1}, {"id": 6, "logprob": -2.5}]
    msg = _llama_error(server, _llama_answer(listed, {"id": 5, "logprob": -0.1}))
    assert "(prompt 'p0')" in msg and "position 0" in msg and "2 top_logprobs entries where 3 were asked" in msg


def test_llama_server_a_token_listed_twice_is_refused(server: FakeOpenAIServer) -> None:
    listed = [{"id": 5, "logprob": -0.1}, {"id": 6, "logprob": -2.5}, {"id": 6, "logprob": -3.0}]
    msg = _llama_error(server, _llama_answer(listed, {"id": 5, "logprob": -0.1}))
    assert "position 0: token 6 is named twice" in msg


def test_llama_server_a_chosen_logprob_that_contradicts_its_entry_is_refused(server: FakeOpenAIServer) -> None:
    listed = [{"id": 5, "logprob": -0.1}, {"id": 6, "logprob": -2.5}, {"id": 7, "logprob": -3.0}]
    msg = _llama_error(server, _llama_answer(listed, {"id": 5, "logprob": -0.9}))
    assert "position 0" in msg and "contradicts itself" in msg
