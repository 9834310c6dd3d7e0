"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.fake_openai_server import FakeOpenAIServer


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake OpenAI-compatible server on 127.0.0.1 (tests/helpers/fake_openai_server.py)."""
    with FakeOpenAIServer() as srv:
        yield srv
