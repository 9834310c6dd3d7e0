"""A fake engine for the runner and CLI tests: a toy language model behind the Engine
contract, with a call history (in the manner of simonw/llm's test fakes).

The toy model's logits at a context are a pure function of (seed, context), on a grid of
0.25 so that exact ties happen: at about one position in four the two leading tokens
get the very same logit, and so bit-identical logprobs. It breaks ties toward the lowest
id, as `torch.argmax` does, unless built with `tie_break=highest` (the mutation the gate
must report as exact ties with tie_break "higher_id").

Options (`--engine-opt key=value`, all strings as the CLI gives them):
  seed            int, which toy model (default 0)
  tie_break       lowest | highest
  bias_token      a token id whose logit gets `bias` added everywhere (default -1: none)
  bias            float, in nats
  second_bias     float, in nats, added to the runner-up's logit at every position: it
                  takes over where the leader was less than this far ahead (at least 0.25)
  fail            load | generate | force: raise RuntimeError there (an engine crash)
  weights_sha256  what info() reports (default "toy-weights-0")
  tokenizer       same | drift (one prompt token differs) | none (cannot tokenize)
  forced          decode | unavailable (force raises ForcedDecodeUnavailable) | unavailable_first
                  (only the first force call raises: one prompt the engine cannot force)
  batch_size      prompts per generate call the runner should use (default: unset)
  fault           an engine fault in generate (or force), for prompt `fault_prompt` (default: all):
                  nan (a NaN logprob) | inf (an infinite one) | short (3 tokens too few, finish
                  "length") | short_stop (the same, finish "stop": an honest early stop) | oov (a
                  token id past the vocabulary) | oov_force (the same in force) | hang | hang_force
                  (wait until `FakeEngine.release` is set, at most 60 s)
  fault_prompt    the prompt id the fault hits
  report_vocab    true | false: whether info() states vocab_size (default true)
  nondeterministic  token | logprob: from its second generation of a prompt on, the engine
                  breaks ties toward the highest id, or shifts one logprob by 1e-6 nats
  hardware        a torch CPU capability (e.g. AVX2) info() reports as the machine it ran on
                  (`gate.core.traces.machine`; default: none reported)

Environment (read when the engine is built, so a resumed run keeps the same options):
  GATE_FAKE_INTERRUPT_AFTER  N: raise KeyboardInterrupt (a Ctrl-C) before the (N+1)-th prompt
  GATE_FAKE_INTERRUPT_FORCE  1: raise KeyboardInterrupt in force (a Ctrl-C while teacher-forcing)
  GATE_FAKE_CRASH_AFTER      N: raise RuntimeError (an engine crash) before the (N+1)-th prompt
  GATE_FAKE_SLEEP            seconds to sleep per generated prompt (for kill tests)
"""

from __future__ import annotations

import math
import os
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gate.core.engine import ForcedDecode, ForcedDecodeUnavailable, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord

VOCAB = 40
BOS = 1
EOS = 2
REGISTRY_NAME = "fake"

OPTIONS: dict[str, tuple[type, Any]] = {
    "seed": (int, 0),
    "dtype": (str, "toy"),
    "tie_break": (str, "lowest"),
    "bias_token": (int, -1),
    "bias": (float, 0.0),
    "second_bias": (float, 0.0),
    "fail": (str, ""),
    "weights_sha256": (str, "toy-weights-0"),
    "tokenizer_sha256": (str, "toy-tokenizer-0"),
    "tokenizer": (str, "same"),
    "forced": (str, "decode"),
    "batch_size": (int, -1),
    "fault": (str, ""),
    "fault_prompt": (str, ""),
    "report_vocab": (bool, True),
    "nondeterministic": (str, ""),
    "hardware": (str, ""),
}


def toy_logits(seed: int, context: Sequence[int]) -> list[float]:
    """Logits on a 0.25 grid; in about a quarter of contexts two tokens lead exactly tied."""
    key = zlib.crc32(bytes(str((seed, tuple(context))), "ascii"))
    rng = _Lcg(key)
    logits = [rng.next() % 9 * 0.25 for _ in range(VOCAB)]
    lead = 3 + rng.next() % (VOCAB - 3)  # never BOS/EOS/0, so runs stay full length
    logits[lead] += 2.25
    if rng.next() % 4 == 0:
        other = 3 + rng.next() % (VOCAB - 3)
        if other != lead:
            logits[other] = logits[lead]
    return logits


class _Lcg:
    def __init__(self, seed: int) -> None:
        self.state = seed or 1

    def next(self) -> int:
        self.state = (1103515245 * self.state + 12345) % (1 << 31)
        return self.state >> 8


def log_softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    norm = top + math.log(sum(math.exp(v - top) for v in logits))
    return [v - norm for v in logits]


def model_folder(model: str) -> str:
    """The toy model's folder: `model` itself when a local path (`--model-path`), else where
    gate's cache would hold it, as it holds the default model."""
    if os.path.isabs(model):
        return model
    from gate.core.storage.files import gate_cache_dir

    return str(gate_cache_dir() / "models" / model.replace("/", "--"))


class FakeEngine:
    """The toy model as an engine. `FakeEngine.history` records every call, in order."""

    name = "fake"
    history: ClassVar[list[tuple[str, Any]]] = []
    # Set to end every hang (tests set it when they finish).
    release: ClassVar[threading.Event] = threading.Event()

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        FakeEngine.history.append(("load", (model, dict(options))))
        if opts["fail"] == "load":
            raise RuntimeError("toy model failed to load")
        self.model = model
        self.opts = opts
        if opts["batch_size"] >= 0:
            self.batch_size = opts["batch_size"]
        self.interrupt_after = int(os.environ.get("GATE_FAKE_INTERRUPT_AFTER", "-1"))
        self.crash_after = int(os.environ.get("GATE_FAKE_CRASH_AFTER", "-1"))
        self.sleep = float(os.environ.get("GATE_FAKE_SLEEP", "0"))
        self.generated: dict[str, int] = {}
        self.prompts_done = 0

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": "1.0",
            "device": "cpu",
            "dtype": "toy",
            "seed": self.opts["seed"],
            "weights_sha256": self.opts["weights_sha256"],
            "tokenizer_sha256": self.opts["tokenizer_sha256"],
            **({"vocab_size": VOCAB} if self.opts["report_vocab"] else {}),
            # Where the toy weights lie, as the real engines report it (an absolute path on
            # this machine: never to be written into a header as it is).
            "model": self.model,
            "model_path": model_folder(self.model),
            **(
                {"hardware": {"device_type": "cpu", "torch_cpu_capability": self.opts["hardware"]}}
                if self.opts["hardware"]
                else {}
            ),
        }

    def _faulty(self, prompt_id: str | None, *faults: str) -> bool:
        return self.opts["fault"] in faults and self.opts["fault_prompt"] in ("", prompt_id)

    def _hang(self) -> None:
        FakeEngine.history.append(("hang", None))
        FakeEngine.release.wait(60)

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        FakeEngine.history.append(("generate", [p.id for p in prompts]))
        if self.opts["fail"] == "generate":
            raise RuntimeError("toy model crashed in generate")
        out = []
        for p in prompts:
            if self.prompts_done == self.interrupt_after:
                raise KeyboardInterrupt
            if self.prompts_done == self.crash_after:
                raise RuntimeError(f"toy model crashed after {self.prompts_done} prompts")
            if self.sleep:
                time.sleep(self.sleep)
            if self._faulty(p.id, "hang"):
                self._hang()
            self.prompts_done += 1
            again = self.generated.get(p.id, 0) > 0
            self.generated[p.id] = self.generated.get(p.id, 0) + 1
            tie_break = "highest" if again and self.opts["nondeterministic"] == "token" else None
            ids: list[int] = []
            tops = []
            for _ in range(p.max_tokens):
                choice, top = self._step([*p.prompt_token_ids, *ids], top_k, tie_break)
                ids.append(choice)
                tops.append(top)
            if again and self.opts["nondeterministic"] == "logprob":
                tops[-1][-1][1] -= 1e-6
            finish = "length"
            if self._faulty(p.id, "nan", "inf"):
                tops[0][0][1] = math.nan if self.opts["fault"] == "nan" else -math.inf
            if self._faulty(p.id, "short", "short_stop"):
                ids, tops = ids[:-3], tops[:-3]
                finish = "stop" if self.opts["fault"] == "short_stop" else "length"
            if self._faulty(p.id, "oov"):
                ids[0] = VOCAB + 5
            out.append(
                PromptRecord(
                    id=p.id,
                    prompt_token_ids=tuple(p.prompt_token_ids),
                    token_ids=tuple(ids),
                    top_logprobs=tops if top_k > 0 else None,
                    finish_reason=finish,
                    prompt=p.prompt,
                )
            )
        return out

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        FakeEngine.history.append(("force", (tuple(prompt_token_ids), len(token_ids))))
        if self.opts["fail"] == "force":
            raise RuntimeError("toy model crashed in force")
        if self.opts["forced"] == "unavailable":
            raise ForcedDecodeUnavailable("toy server: no prompt logprobs")
        if self.opts["forced"] == "unavailable_first" and sum(h[0] == "force" for h in FakeEngine.history) == 1:
            raise ForcedDecodeUnavailable("toy server: this prompt cannot be forced")
        if os.environ.get("GATE_FAKE_INTERRUPT_FORCE") == "1":
            raise KeyboardInterrupt
        if self._faulty(None, "hang_force"):
            self._hang()
        chosen = []
        tops = []
        for i in range(len(token_ids)):
            choice, top = self._step([*prompt_token_ids, *token_ids[:i]], top_k)
            chosen.append(choice)
            tops.append(top)
        if self._faulty(None, "oov_force"):
            chosen[-1] = VOCAB + 5
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops, mode="decode")

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        if self.opts["tokenizer"] == "none":
            return None
        if messages is not None:
            text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        assert text is not None
        ids = [BOS, *(3 + ord(c) % (VOCAB - 3) for c in text)]
        if self.opts["tokenizer"] == "drift" and len(ids) > 2:
            ids[2] = 3 + (ids[2] - 3 + 1) % (VOCAB - 3)
        return tuple(ids)

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return [f"<t{int(t)}>" for t in ids]

    def close(self) -> None:
        FakeEngine.history.append(("close", None))

    # ------------------------------------------------------------------ the toy model

    def _step(self, context: Sequence[int], top_k: int, tie_break: str | None = None) -> tuple[int, list[list[Any]]]:
        logits = toy_logits(self.opts["seed"], context)
        if 0 <= self.opts["bias_token"] < VOCAB:
            logits[self.opts["bias_token"]] += self.opts["bias"]
        if self.opts["second_bias"]:
            runner_up = sorted(range(VOCAB), key=lambda t: (-logits[t], t))[1]
            logits[runner_up] += self.opts["second_bias"]
        best = max(logits)
        tied = [i for i, v in enumerate(logits) if v == best]
        # torch.argmax's rule: the lowest index among equal maxima; `highest` is the mutation.
        choice = tied[-1] if (tie_break or self.opts["tie_break"]) == "highest" else tied[0]
        lps = log_softmax(logits)
        order = sorted(range(VOCAB), key=lambda t: (-lps[t], t))[: max(top_k, 1)]
        if choice not in order:
            order.append(choice)
        return choice, [[t, lps[t]] for t in sorted(order, key=lambda t: (-lps[t], t))]
