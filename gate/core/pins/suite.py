"""Prompt suites: the prompts a pin is recorded on (JSON Lines, one prompt per line).

Each line is an object with:
- `id`: a non-empty string, unique in the file;
- exactly one of `text` (a raw prompt, tokenized as it is) or `messages` (chat messages
  `[{"role": ..., "content": ...}, ...]`, rendered through the model's chat template);
- `max_tokens`: how many tokens to generate, an integer >= 1 (optional: a suite may leave
  it to the pin's `oracle.json`).

A suite is hashed into the pin it is recorded with: `Suite.sha256` covers every prompt
with its resolved `max_tokens`, in order, so a changed suite is never silently gated
against a pin recorded from another one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gate.errors import InputError

ROLES = ("system", "user", "assistant")
_KEYS = ("id", "text", "messages", "max_tokens")
# One prompt generates at most this many tokens: a typo (320000 for 32) fails at once
# instead of running for hours.
MAX_TOKENS_LIMIT = 65536


@dataclass(frozen=True, slots=True)
class SuitePrompt:
    """One prompt: raw `text` or chat `messages` (exactly one of them), and `max_tokens`."""

    id: str
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    max_tokens: int | None = None
    line: int = 0

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def display(self) -> str:
        """The prompt as a person reads it: the text, or the last message's content."""
        if self.text is not None:
            return self.text
        assert self.messages is not None
        return self.messages[-1][1]

    def messages_dicts(self) -> list[dict[str, str]] | None:
        if self.messages is None:
            return None
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.text is not None:
            out["text"] = self.text
        else:
            out["messages"] = self.messages_dicts()
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out

    @property
    def sha256(self) -> str:
        """Hash of the canonical JSON of this prompt (id, text or messages, max_tokens)."""
        return hashlib.sha256(orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class Suite:
    prompts: tuple[SuitePrompt, ...]
    path: str = "<memory>"

    def __iter__(self) -> Iterator[SuitePrompt]:
        return iter(self.prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.prompts)

    def by_id(self) -> dict[str, SuitePrompt]:
        return {p.id: p for p in self.prompts}

    def resolved(self, default_max_tokens: int | None = None, *, override: int | None = None) -> Suite:
        """Every prompt with a `max_tokens`: `override` if given, else its own, else the default."""
        out = []
        for p in self.prompts:
            n = override if override is not None else p.max_tokens if p.max_tokens is not None else default_max_tokens
            if n is None:
                raise InputError(
                    f"{self.path}:{p.line}: field 'max_tokens': missing for prompt {p.id!r} and no default "
                    "(set it in the suite, in oracle.json, or pass --max-tokens)"
                )
            out.append(replace(p, max_tokens=n))
        return Suite(prompts=tuple(out), path=self.path)

    def encode(self) -> bytes:
        """The canonical JSON Lines form (what a pin folder's suite.jsonl holds)."""
        return b"".join(orjson.dumps(p.to_dict(), option=orjson.OPT_APPEND_NEWLINE) for p in self.prompts)

    @property
    def sha256(self) -> str:
        """Hash of the canonical form: formatting and key order in the file do not count."""
        return hashlib.sha256(self.encode()).hexdigest()

    def prompt_hashes(self) -> dict[str, str]:
        return {p.id: p.sha256 for p in self.prompts}

    def same_prompts(self, other: Suite) -> bool:
        return [p.to_dict() for p in self.prompts] == [p.to_dict() for p in other.prompts]


# --------------------------------------------------------------------------- reading


def read_suite(path: str | os.PathLike[str]) -> Suite:
    """Read and validate a suite file; every error names the file, line and field."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise InputError(f"{name}: no such prompt suite file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, not a prompt suite file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    return parse_suite(data, name)


def parse_suite(data: bytes, name: str = "<suite>") -> Suite:
    prompts: list[SuitePrompt] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{name}:{lineno}: bad JSON: {exc}") from None
        prompt = _parse_prompt(name, lineno, obj)
        if prompt.id in seen:
            raise InputError(
                f"{name}:{lineno}: field 'id': duplicate id {prompt.id!r} (first on line {seen[prompt.id]})"
            )
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise InputError(
            f"{name}: the prompt suite is empty (one JSON object per line: id, text or messages, max_tokens)"
        )
    return Suite(prompts=tuple(prompts), path=name)


def _fail(name: str, lineno: int, fld: str | None, problem: str) -> InputError:
    where = f"{name}:{lineno}"
    return InputError(f"{where}: field '{fld}': {problem}" if fld else f"{where}: {problem}")


def _parse_prompt(name: str, lineno: int, obj: Any) -> SuitePrompt:
    if not isinstance(obj, dict):
        raise _fail(name, lineno, None, "a prompt must be a JSON object with id, text or messages, max_tokens")
    unknown = sorted(k for k in obj if k not in _KEYS)
    if unknown:
        raise _fail(name, lineno, unknown[0], f"unknown field (known: {', '.join(_KEYS)})")
    rid = obj.get("id")
    if "id" not in obj:
        raise _fail(name, lineno, "id", "missing")
    if not isinstance(rid, str) or not rid.strip():
        raise _fail(name, lineno, "id", f"must be a non-empty string, found {rid!r}")
    has_text, has_messages = "text" in obj, "messages" in obj
    if has_text == has_messages:
        which = "both" if has_text else "neither"
        raise _fail(name, lineno, "text", f"prompt {rid!r} has {which} of 'text' and 'messages': give exactly one")
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    if has_text:
        text = obj["text"]
        if not isinstance(text, str):
            raise _fail(name, lineno, "text", f"must be a string, found {type(text).__name__}")
        if not text.strip():
            raise _fail(name, lineno, "text", f"prompt {rid!r} is empty")
    else:
        messages = _parse_messages(name, lineno, rid, obj["messages"])
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS_LIMIT):
        raise _fail(
            name, lineno, "max_tokens", f"must be an integer from 1 to {MAX_TOKENS_LIMIT}, found {max_tokens!r}"
        )
    return SuitePrompt(id=rid, text=text, messages=messages, max_tokens=max_tokens, line=lineno)


def _parse_messages(name: str, lineno: int, rid: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _fail(name, lineno, "messages", f"prompt {rid!r}: must be a non-empty list of {{role, content}} objects")
    out = []
    for i, msg in enumerate(value):
        fld = f"messages[{i}]"
        if not isinstance(msg, Mapping) or set(msg) != {"role", "content"}:
            raise _fail(name, lineno, fld, "must be an object with exactly 'role' and 'content'")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise _fail(name, lineno, f"{fld}.role", f"must be one of {', '.join(ROLES)}, found {role!r}")
        if not isinstance(content, str):
            raise _fail(name, lineno, f"{fld}.content", f"must be a string, found {type(content).__name__}")
        if not content.strip():
            raise _fail(name, lineno, f"{fld}.content", f"prompt {rid!r}: empty message")
        out.append((role, content))
    if not any(role == "user" for role, _ in out):
        raise _fail(name, lineno, "messages", f"prompt {rid!r}: needs at least one 'user' message")
    return tuple(out)
