"""An OpenAI-style answer must hold exactly one choice, for index 0 (gate sends one prompt
and asks for one completion): a server that answers with two, or with the choice of
another index (a batching proxy mixing answers up), used to be read as choices[0], a guess
at which one is the prompt's greedy continuation. Exit 3, one line naming the prompt.
Against the fake server on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from helpers.fake_openai_server import FakeOpenAIServer, Reply, no_retry_engine

from gate.core.engine import PromptInput
from gate.engines.http.openai_http import only_choice
from gate.errors import EngineError

PROMPT = PromptInput("p0", (11, 12, 13), 4)


def _honest(server: FakeOpenAIServer) -> dict[str, Any]:
    body = {"model": "fake/model", "prompt": list(PROMPT.prompt_token_ids), "max_tokens": PROMPT.max_tokens}
    status, obj = server.answer({**body, "logprobs": 3}, None)
    assert status == 200
    return obj


def _bent(obj: dict[str, Any], how: str) -> dict[str, Any]:
    (choice,) = obj["choices"]
    if how == "two choices":
        other = orjson.loads(orjson.dumps(choice))
        other["index"] = 1
        obj["choices"] = [choice, other]
    elif how == "index 1":
        choice["index"] = 1
    elif how == "index not an int":
        choice["index"] = "0"
    return obj


@pytest.mark.parametrize("how", ["two choices", "index 1", "index not an int"])
def test_an_answer_that_is_not_one_choice_for_index_0_is_refused(server: FakeOpenAIServer, how: str) -> None:
    server.queue(Reply(body=orjson.dumps(_bent(_honest(server), how))))
    with pytest.raises(EngineError) as info:
        no_retry_engine(server.url).generate([PROMPT], 3)
    msg = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in msg and "(prompt 'p0')" in msg
    assert "choice" in msg


def test_one_choice_for_index_0_or_without_an_index_is_read(server: FakeOpenAIServer) -> None:
    obj = _honest(server)
    del obj["choices"][0]["index"]
    server.queue(Reply(body=orjson.dumps(obj)))
    (rec,) = no_retry_engine(server.url).generate([PROMPT], 3)
    assert rec.token_ids == tuple(server.model.greedy(PROMPT.prompt_token_ids, 4))
    assert only_choice([{"index": 0}]) == {"index": 0} and only_choice([{}]) == {}


@pytest.mark.parametrize(
    ("choices", "needle"),
    [
        (None, "no choices"),
        ([], "no choices"),
        (["x"], "not an object"),
        ([{"index": 0}, {"index": 1}], "2 choices"),
        ([{"index": 2}], "index 2"),
        ([{"index": True}], "index True"),
    ],
)
def test_the_rule_both_openai_dialects_apply(choices: Any, needle: str) -> None:
    problem = only_choice(choices)
    assert isinstance(problem, str) and needle in problem
