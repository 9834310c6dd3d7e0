"""`--engine openai --engine-opt prompt=text`: OpenAI-compatible servers that take only text
(llama-cpp-python's `python -m llama_cpp.server`, and the same API in other local servers).

Such a server refuses a prompt of token ids and answers with tokens as decoded strings, so
gate can trust neither direction without checking it:

- The prompt goes out as text: the pinned text when the server tokenises it to exactly the
  pinned ids, else the pinned ids decoded by the model's own tokenizer (`tokenizer.json`
  where gate has the model's folder; special tokens spelled out: a chat prompt's rendered
  template) or by the server, when that tokenises back to them. The check goes through the server's
  tokenize endpoint (`tokenize_path`, llama-cpp-python's `/extras/tokenize`, answered with the
  tokenisation its completions use); a prompt whose ids no text reproduces is refused
  (exit 2: tokenizer drift, never a divergence).
- A returned token string is mapped to an id only when that is unambiguous: the server
  tokenises the string to exactly one id t, and detokenises t (strictly, as UTF-8) back to
  the same string. A string that fails (a partial UTF-8 character, which llama-cpp-python
  drops, so several byte tokens all read ""; a special token's empty rendering) is an engine
  error naming the position, never a guess. The generated text must equal the mapped
  tokens' strings joined, which catches bytes a string hid.
- Top-k maps keyed by strings lose entries when two ids share a string (a space token, and a
  space plus a partial character that llama-cpp-python drops, both read " "), and the value
  left is the later one's. A map with fewer keys than asked keeps only the chosen token (its
  logprob comes from `token_logprobs`); otherwise gate keeps each list up to its first key
  that does not map or whose logprob is above the one before it.
- The token a server stopped on is not in its answer (llama-cpp-python drops it). Gate names
  it only after checking: the candidate stop ids (`stop_token_ids`, default the model's
  `eos_token_id` from its config where gate has the model's folder) are tried one at a time
  with `logit_bias` -100 on the same text, and the one whose bias makes the server go on is
  the token it stopped on. That record carries no top-k lists (the server gave none at the
  stop). None confirmed: an engine error.

Forced decode is one request per oracle position (`forced=decode`), on the text of the
prompt plus the oracle's tokens so far, checked the same way; a prefix no text reproduces
makes the prompt's forced data unavailable (its positions after the first divergence stay
unadjudicated). llama-cpp-python reuses the longest cached prefix, so each request decodes one
token on the KV cache.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from gate.core.engine import ForcedDecode, ForcedDecodeUnavailable, PromptInput
from gate.core.traces.trace import PromptRecord
from gate.engines._common import Pairs, greedy_record
from gate.engines.http.openai_http import HttpClient, ServerError, logprobs_agree, only_choice, quote
from gate.errors import EngineError, InputError

FORCED_MODES = ("decode", "none")
# Below any logit a model gives: a token biased by this is never the argmax.
STOP_BIAS = -100.0


class TextCompletionsDialect:
    """`/v1/completions` with text prompts and string-keyed logprobs (see the module doc)."""

    name = "openai /v1/completions, text prompts"

    def __init__(
        self,
        http: HttpClient,
        *,
        served_model: str,
        retries: int,
        max_logprobs: int,
        forced_mode: str,
        sampling: Mapping[str, Any],
        tokenize_path: str,
        stop_token_ids: Sequence[int],
        local_decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        self.http = http
        self.served_model = served_model
        self.retries = retries
        self.max_logprobs = max_logprobs
        self.forced_mode = forced_mode
        self.sampling = dict(sampling)
        self.tokenize_path = tokenize_path
        self.detokenize_path = tokenize_path.replace("tokenize", "detokenize")
        self.stop_token_ids = tuple(stop_token_ids)
        # The pinned model's own tokenizer, where gate has its file: it spells special tokens
        # out, which a server's detokenize (llama-cpp-python's) leaves out.
        self.local_decode = local_decode
        self.where = f"{http.endpoint.display}/completions"
        self._lock = threading.Lock()
        self._ids_of: dict[str, tuple[int, ...]] = {}
        self._text_of: dict[tuple[int, ...], str | None] = {}
        self._added: tuple[int, ...] | None = None
        self._answered: set[str] = set()

    # ----------------------------------------------------------------- the dialect

    def describe(self) -> dict[str, Any]:
        return {
            "prompt": "text",
            "tokenize": self.http.endpoint.root_display + self.tokenize_path,
            "token_mapping": "string -> id only where the server tokenises it to one id that detokenises back",
            "stop_token_ids": list(self.stop_token_ids),
        }

    def generate(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        text = self._prompt_text(prompt)
        if prompt.max_tokens == 0:
            return greedy_record(prompt, (), [] if top_k > 0 else None, "length", ())
        ids, _, tops, finish = self._complete(text, prompt.max_tokens, top_k, prompt.id)
        if finish == "stop" and len(ids) < prompt.max_tokens:
            ids.append(self._stopped_on((*prompt.prompt_token_ids, *ids), prompt.id))
            tops = None
        return greedy_record(prompt, ids, tops if top_k > 0 else None, finish, None)

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        if self.forced_mode == "none":
            raise ForcedDecodeUnavailable(
                f"{self.where}: forced decode is off (--engine-opt forced=none); "
                "positions after a prompt's first divergence stay unadjudicated"
            )
        full = (*(int(t) for t in prompt_token_ids), *(int(t) for t in token_ids))
        n = len(prompt_token_ids)
        # Every prefix must be expressible as text before any is asked: a greedy answer need
        # not be the canonical tokenisation of its own text (two "\n" tokens, where the
        # tokenizer merges "\n\n"), and such a state cannot be sent to a text server.
        texts = []
        for i in range(len(token_ids)):
            text = self._text_for(full[: n + i])
            if text is None:
                raise ForcedDecodeUnavailable(
                    f"{self.where}: no text the server tokenises to the prompt plus the oracle's first {i} tokens "
                    "(they are not the tokenisation of their own text); forced data is unavailable for this prompt"
                )
            texts.append(text)
        chosen: list[int] = []
        tops: list[Pairs] = []
        with_tops = top_k > 0
        for i, text in enumerate(texts):
            prefix = full[: n + i]
            ids, _, lists, finish = self._complete(text, 1, top_k, None)
            if ids:
                chosen.append(ids[0])
                if lists is not None:
                    tops.extend(lists)
            elif finish == "stop":
                chosen.append(self._stopped_on(prefix, None))
                with_tops = False
            else:
                self._fail(None, f"forced position {i}: no token and finish_reason {finish!r}")
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops if with_tops else None, mode="decode")

    def answered_models(self) -> set[str]:
        """The model names the server's completions answered as."""
        with self._lock:
            return set(self._answered)

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        out = []
        for t in ids:
            text = self._detokenize((int(t),))
            if text is None:
                return None
            out.append(text)
        return out

    # ----------------------------------------------------------------- tokenisation

    def _tokenize(self, text: str) -> tuple[int, ...]:
        with self._lock:
            hit = self._ids_of.get(text)
        if hit is not None:
            return hit
        body = orjson.dumps({"input": text, "model": self.served_model})
        obj = self.http.call("POST", self.tokenize_path, body, self.retries, root=True)
        tokens = obj.get("tokens") if isinstance(obj, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise EngineError(
                f"{self.http.endpoint.root_display}{self.tokenize_path}: "
                "the answer has no list of token ids in `tokens`"
            )
        ids = tuple(tokens)
        with self._lock:
            self._ids_of[text] = ids
        return ids

    def _added_ids(self) -> tuple[int, ...]:
        """What the server's tokenizer puts before any text (a BOS where the model adds one)."""
        if self._added is None:
            self._added = self._tokenize("")
        return self._added

    def _detokenize(self, ids: tuple[int, ...]) -> str | None:
        """The server's text of `ids`, or None where it is not valid UTF-8 (the server refuses)."""
        with self._lock:
            if ids in self._text_of:
                return self._text_of[ids]
        body = orjson.dumps({"tokens": list(ids), "model": self.served_model})
        try:
            obj = self.http.call("POST", self.detokenize_path, body, 0, root=True)
        except ServerError:
            text = None
        except EngineError as exc:
            if "HTTP 5" not in str(exc):
                raise
            text = None  # llama-cpp-python decodes strictly: a partial character is a 500
        else:
            value = obj.get("text") if isinstance(obj, dict) else None
            text = value if isinstance(value, str) else None
        with self._lock:
            self._text_of[ids] = text
        return text

    def _prompt_text(self, prompt: PromptInput) -> str:
        pinned = tuple(int(t) for t in prompt.prompt_token_ids)
        got: tuple[int, ...] = ()
        for text in (prompt.prompt, *self._texts_of(pinned)):
            if text is None:
                continue
            got = self._tokenize(text)
            if got == pinned:
                return text
        j = next((k for k, (a, b) in enumerate(zip(pinned, got, strict=False)) if a != b), min(len(pinned), len(got)))
        raise InputError(
            f"prompt {prompt.id!r}: the server at {self.http.endpoint.display} tokenises its text "
            f"to {len(got)} tokens, "
            f"the pin has {len(pinned)}; first difference at index {j} (pin "
            f"{pinned[j] if j < len(pinned) else 'end'}, server {got[j] if j < len(got) else 'end'}). "
            "The server's tokenizer is not the pinned one, so gate cannot send this prompt as text"
        )

    def _texts_of(self, ids: tuple[int, ...]) -> list[str | None]:
        """Texts that may tokenise to `ids`: the pinned model's own decoding (special tokens
        spelled out), then the server's; each is checked before it is used."""
        local = self.local_decode(ids) if self.local_decode is not None else None
        return [local, self._detokenize(ids)]

    def _text_for(self, ids: tuple[int, ...]) -> str | None:
        for text in self._texts_of(ids):
            if text is not None and self._tokenize(text) == ids:
                return text
        return None

    def _token_id(self, s: str) -> int | None:
        """The one id whose text is `s`, or None where that is not unambiguous."""
        if not s:
            return None
        ids = self._tokenize(s)
        added = self._added_ids()
        if added and ids[: len(added)] == added:
            ids = ids[len(added) :]
        if len(ids) != 1 or self._detokenize(ids) != s:
            return None
        return ids[0]

    # ----------------------------------------------------------------- requests

    def _body(self, text: str, max_tokens: int, top_k: int, **more: Any) -> bytes:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": text,
            "max_tokens": max_tokens,
            "temperature": 0,
            "n": 1,
            "stream": False,
            "echo": False,
            "logprobs": max(1, min(top_k, self.max_logprobs)),
            **self.sampling,
        }
        body.update(more)
        return orjson.dumps(body)

    def _complete(
        self, text: str, max_tokens: int, top_k: int, prompt_id: str | None, **more: Any
    ) -> tuple[list[int], list[str], list[Pairs] | None, str]:
        about = f" (prompt {prompt_id!r})" if prompt_id is not None else ""
        body = self._body(text, max_tokens, top_k, **more)
        obj = self.http.call("POST", "/completions", body, self.retries, about=about)
        name = obj.get("model") if isinstance(obj, dict) else None
        if isinstance(name, str):
            with self._lock:
                self._answered.add(name)
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = only_choice(choices)
        if isinstance(choice, str):
            self._fail(prompt_id, choice)
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            self._fail(prompt_id, f"finish_reason {finish!r} (expected stop or length)")
        lp = choice.get("logprobs")
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        token_lps = lp.get("token_logprobs") if isinstance(lp, dict) else None
        tops = lp.get("top_logprobs") if isinstance(lp, dict) else None
        if not (isinstance(tokens, list) and isinstance(token_lps, list) and isinstance(tops, list)):
            self._fail(prompt_id, "logprobs lacks the lists tokens, token_logprobs and top_logprobs")
        if not len(tokens) == len(token_lps) == len(tops) or len(tokens) > max_tokens:
            self._fail(prompt_id, f"logprobs lists of {len(tokens)}, {len(token_lps)}, {len(tops)} for {max_tokens}")
        if len(tokens) < max_tokens and finish != "stop":
            self._fail(prompt_id, f"{len(tokens)} of {max_tokens} tokens with finish_reason {finish!r}")
        ids = []
        for i, s in enumerate(tokens):
            tid = self._token_id(s) if isinstance(s, str) else None
            if tid is None:
                self._fail(
                    prompt_id,
                    f"position {i}: token {quote(repr(s), 40)} does not map to one token id (the server tokenises "
                    "it to several, or it is a partial character or a special token's empty text); gate does not "
                    "guess ids from strings",
                )
            ids.append(tid)
        if choice.get("text") != "".join(tokens):
            self._fail(prompt_id, "the generated text is not its tokens' strings joined: a token hid bytes")
        lists = [self._top_list(tops[i], ids[i], token_lps[i], top_k, prompt_id, i) for i in range(len(ids))]
        return ids, list(tokens), lists if top_k > 0 else None, str(finish)

    def _top_list(
        self, top: Any, chosen: int, chosen_lp: Any, top_k: int, prompt_id: str | None, position: int
    ) -> Pairs:
        if not isinstance(top, dict):
            self._fail(prompt_id, f"position {position}: top_logprobs is not an object")
        pairs: dict[int, float] = {}
        previous = 0.0
        # Fewer keys than asked: two ids shared a string and one overwrote the other's value,
        # in a place no key shows (a space token and a space plus a dropped partial byte both
        # read " "). Then only the chosen token's own logprob is trusted.
        # The list this keeps is then shorter than the pin's top_k, and the record says so
        # (the header's top_k stays the one asked): the distribution verdict counts such a
        # position as not judged, never as judged on the shortened list.
        items = list(top.items()) if len(top) >= max(1, min(top_k, self.max_logprobs)) else []
        if type(chosen_lp) not in (int, float) or not float("-inf") < chosen_lp <= 0:
            self._fail(prompt_id, f"position {position}: logprob {chosen_lp!r} is not a finite number <= 0")
        for key, value in items:
            tid = self._token_id(key) if isinstance(key, str) else None
            if tid is None or type(value) not in (int, float) or not float("-inf") < value <= previous:
                break  # beyond here the string-keyed map may have lost or overwritten entries
            if tid in pairs:
                self._fail(prompt_id, f"position {position}: token {tid} is named twice in one top_logprobs object")
            pairs[tid] = float(value)
            previous = float(value)
        if chosen in pairs and not logprobs_agree(pairs[chosen], float(chosen_lp)):
            # The chosen token's string carries another id's value (ids that share a string):
            # nothing in the map can be trusted, only the chosen token's own logprob.
            pairs = {}
        if chosen not in pairs:
            pairs[chosen] = float(chosen_lp)
        ordered = sorted(pairs.items(), key=lambda p: (-p[1], p[0]))
        kept = [[t, lp] for t, lp in ordered[: max(top_k, 1)]]
        if all(t != chosen for t, _ in kept):
            kept.append([chosen, pairs[chosen]])
        return kept

    def _stopped_on(self, so_far: Sequence[int], prompt_id: str | None) -> int:
        """The id of the token the server stopped on after `so_far` (prompt and generated
        ids), confirmed by `logit_bias` (module doc)."""
        text = self._text_for(tuple(int(t) for t in so_far))
        if text is None:
            self._fail(prompt_id, "the server stopped, and no text reproduces the tokens before the stop")
        for candidate in self.stop_token_ids:
            ids, _, _, _ = self._complete(text, 1, 0, prompt_id, logit_bias={str(candidate): STOP_BIAS})
            if ids:
                return candidate
        tried = ", ".join(map(str, self.stop_token_ids)) or "none given"
        self._fail(
            prompt_id,
            f"the server stopped on a token it does not name, and no candidate stop id ({tried}) is it "
            "(biasing each down did not make the server go on); give the model's stop ids with "
            "--engine-opt stop_token_ids=ID,ID",
        )

    def _fail(self, prompt_id: str | None, problem: str) -> NoReturn:
        about = f" (prompt {prompt_id!r})" if prompt_id is not None else ""
        raise EngineError(self.http.scrub(f"{self.where}{about}: {problem}"))


def stop_ids(model: str, raw: str | None) -> tuple[int, ...]:
    """The ids a text server's stop may have been on: `stop_token_ids`, else the model's
    `eos_token_id` from its generation config (or config) where gate has its folder."""
    if raw:
        try:
            return tuple(int(x) for x in raw.split(",") if x.strip())
        except ValueError:
            raise InputError(f"--engine-opt stop_token_ids={raw}: expected token ids separated by commas") from None
    folder = model_folder(model)
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
        if ids and all(type(t) is int and t >= 0 for t in ids):
            return tuple(ids)
    return ()


def model_folder(model: str) -> Path:
    from gate.models.default import DEFAULT_MODEL, default_model_dir
    from gate.models.qwen_tiny import QWEN_TINY, packaged_dir

    if model == QWEN_TINY:
        return packaged_dir()
    return default_model_dir() if model == DEFAULT_MODEL else Path(model).expanduser()


def local_decoder(model: str) -> Any:
    """The pinned model's own decoder (special tokens spelled out) from its `tokenizer.json`,
    where gate has the model's folder; None otherwise."""
    path = model_folder(model) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
    except Exception:  # no tokenizers package, or a file it cannot read: the server's decode only
        return None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)
