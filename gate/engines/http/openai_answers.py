"""Reading vLLM's token-id answers (`/v1/completions` with `return_tokens_as_token_ids`):
choices, `"token_id:N"` keys, top-k maps, echoed prompt logprobs, each refused with one
line naming the prompt and position where it cannot be read without guessing: a key that
does not name an id, an id named twice, a `token_logprobs` value that contradicts the
same token's `top_logprobs` entry, fewer entries than asked."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from gate.engines.http.openai_http import HttpClient, error_text, logprobs_agree, only_choice, quote
from gate.errors import EngineError

_TOKEN_KEY = re.compile(r"token_id:(\d+)\Z")


class TokenIdAnswers:
    """The answer-reading half of `OpenAIEngine` (it sets `_http` and `max_logprobs`)."""

    _http: HttpClient
    max_logprobs: int

    def _logprobs_for(self, top_k: int) -> int:
        # At least 1: the chosen tokens come back as "token_id:N" only alongside logprobs.
        return max(1, min(top_k, self.max_logprobs))

    def _echo_rows(self, choice: Mapping[str, Any], sent: Sequence[int], where: str) -> list[Any] | None:
        """Prompt logprobs from the standard `echo` answer (the prompt's tokens come first), or None."""
        lp = choice.get("logprobs")
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        tops = lp.get("top_logprobs") if isinstance(lp, dict) else None
        if (
            not isinstance(tokens, list)
            or not isinstance(tops, list)
            or len(tokens) < len(sent)
            or len(tops) < len(sent)
        ):
            return None
        echoed = [self._token_id(t, where, None, f"tokens[{i}]") for i, t in enumerate(tokens[: len(sent)])]
        if echoed != list(sent):
            j = next(i for i, (a, b) in enumerate(zip(echoed, sent, strict=True)) if a != b)
            raise EngineError(
                f"{where}: the echoed prompt differs from the one sent at index {j} "
                f"(sent {sent[j]}, echoed {echoed[j]}): the server re-tokenised the prompt"
            )
        own = lp.get("token_logprobs") if isinstance(lp, dict) else None
        rows: list[Any] = []
        for i, top in enumerate(tops[: len(sent)]):
            if top is None:
                rows.append(None)
            elif isinstance(top, dict):
                row = [(self._token_id(key, where, None, f"top_logprobs[{i}]"), v) for key, v in top.items()]
                listed = dict(self._sorted_pairs(row, where, None, i))
                given: Any = own[i] if isinstance(own, list) and i < len(own) else None
                if (
                    type(given) in (int, float)
                    and sent[i] in listed
                    and not logprobs_agree(listed[sent[i]], float(given))
                ):
                    self._fail(
                        where,
                        None,
                        f"prompt position {i}: token_logprobs gives token {sent[i]} logprob {given!r}, its "
                        f"top_logprobs entry {listed[sent[i]]!r}; the answer contradicts itself",
                    )
                rows.append(row)
            else:
                self._fail(where, None, f"logprobs.top_logprobs[{i}] is not an object")
        return rows

    def _choice(self, obj: Any, where: str, prompt_id: str | None) -> dict[str, Any]:
        if isinstance(obj, dict) and isinstance(obj.get("error"), (dict, str)) and "choices" not in obj:
            self._fail(where, prompt_id, f"the server answered with an error: {error_text(obj)}")
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = only_choice(choices)
        if isinstance(choice, str):
            self._fail(where, prompt_id, choice)
        return choice

    def _token_id(self, value: Any, where: str, prompt_id: str | None, fld: str) -> int:
        if type(value) is int and value >= 0:
            return value
        if isinstance(value, str):
            m = _TOKEN_KEY.match(value)
            if m:
                return int(m.group(1))
        self._fail(
            where,
            prompt_id,
            f"logprobs.{fld} is {quote(repr(value), 60)}, not 'token_id:N': the server does not honour "
            "return_tokens_as_token_ids, and tokens keyed by decoded text collide for distinct ids, so gate "
            "cannot recover token ids from this server (vLLM supports the flag; see the README)",
        )

    def _sorted_pairs(
        self, items: Iterable[tuple[Any, Any]], where: str, prompt_id: str | None, position: int
    ) -> list[tuple[int, float]]:
        pairs: dict[int, float] = {}
        for key, value in items:
            tid = key if type(key) is int else self._token_key(key, where, prompt_id, position)
            lp = value.get("logprob") if isinstance(value, dict) else value
            if tid in pairs:
                # Two keys for one id ("token_id:7" and "token_id:07", or "7"): which value
                # counts would be a guess.
                self._fail(
                    where, prompt_id, f"position {position}: token {tid} is named twice in one top_logprobs object"
                )
            pairs[tid] = self._logprob(lp, where, prompt_id, position)
        # Sorted as the spec's lists are: logprob descending, then token id ascending.
        return sorted(pairs.items(), key=lambda p: (-p[1], p[0]))

    def _token_key(self, key: Any, where: str, prompt_id: str | None, position: int) -> int:
        # vLLM's own prompt_logprobs are keyed by the id as a decimal string.
        if isinstance(key, str) and key.isdigit():
            return int(key)
        return self._token_id(key, where, prompt_id, f"top_logprobs[{position}]")

    def _logprob(self, value: Any, where: str, prompt_id: str | None, position: int) -> float:
        if type(value) not in (int, float) or not math.isfinite(value) or value > 0:
            self._fail(where, prompt_id, f"position {position}: logprob {value!r} is not a finite number <= 0")
        return float(value)

    def _top_list(
        self, top: Any, chosen: int, chosen_lp: Any, top_k: int, where: str, prompt_id: str, position: int
    ) -> list[list[Any]]:
        if not isinstance(top, dict):
            self._fail(where, prompt_id, f"logprobs.top_logprobs[{position}] is not an object")
        pairs = dict(self._sorted_pairs(top.items(), where, prompt_id, position))
        own = self._logprob(chosen_lp, where, prompt_id, position)
        if chosen not in pairs:
            # Some servers list only the top k; the chosen token's own logprob is beside them.
            pairs[chosen] = own
        elif not logprobs_agree(pairs[chosen], own):
            self._fail(
                where,
                prompt_id,
                f"position {position}: token_logprobs gives token {chosen} logprob {own!r}, its top_logprobs "
                f"entry {pairs[chosen]!r}; the answer contradicts itself",
            )
        self._check_count(len(pairs), top_k, where, prompt_id, position)
        ordered = sorted(pairs.items(), key=lambda p: (-p[1], p[0]))
        return keep_top(ordered, chosen, top_k)

    def _check_count(self, n: int, top_k: int, where: str, prompt_id: str | None, position: int) -> None:
        """A list shorter than asked would be judged on less evidence than the pin's: refused."""
        asked = self._logprobs_for(top_k)
        if top_k > 0 and n < asked:
            self._fail(
                where,
                prompt_id,
                f"position {position}: {n} top-logprob entries where {asked} were asked (logprobs={asked}); "
                "a shortened list cannot be judged",
            )

    def _fail(self, where: str, prompt_id: str | None, problem: str) -> NoReturn:
        about = f" (prompt {prompt_id!r})" if prompt_id is not None else ""
        raise EngineError(self._scrub(f"{where}{about}: {problem}"))

    def _scrub(self, text: str) -> str:
        return self._http.scrub(text)


def prompt_logprob_rows(choice: Mapping[str, Any], n: int) -> list[dict[Any, Any] | None] | None:
    """vLLM's own `prompt_logprobs` (ids as keys, {"logprob", "rank", ...} as values), if sent."""
    rows = choice.get("prompt_logprobs")
    if not isinstance(rows, list) or len(rows) < n:
        return None
    if not all(r is None or isinstance(r, dict) for r in rows):
        return None
    return rows


def keep_top(pairs: Sequence[tuple[int, float]], chosen: int, top_k: int) -> list[list[Any]]:
    """The first `top_k` pairs, plus `chosen` (after them, in order) when it falls outside."""
    kept = [[t, lp] for t, lp in pairs[: max(top_k, 1)]]
    if all(t != chosen for t, _ in kept):
        kept.extend([t, lp] for t, lp in pairs if t == chosen)
    return kept
