"""The ONNX Runtime GenAI engine: an ONNX build of the model, decoded by `og.Generator`.

The model: by default the ONNX build of the pinned checkpoint, made once by ONNX Runtime
GenAI's own model builder (`gate.engines.ortgenai.builder`: fp32 or int4, CPU, cached under gate's cache
with a manifest); `model_path=FOLDER` runs any prebuilt ONNX Runtime GenAI folder instead.

Greedy decode is the runtime's own: `GeneratorParams.set_search_options(do_sample=False)`,
then `generate_next_token()` picks the token (its CPU greedy search is
`std::max_element` over the scores, which returns the first maximum: ties go to the lowest
id, as in the oracle). Before each pick gate reads `get_logits()` (the float32 logits of
the position) for the top-k list (`gate.engines._logits`: log-softmax with a float64 subtraction).

Teacher-forced decode goes through the same generator: at each position the runtime picks
its token (`generate_next_token`), gate records it, rewinds that one token
(`rewind_to`) and appends the oracle's token instead (`append_tokens`), so the next
position is computed by one decode step on the KV cache, exactly as in the free run.

Batched decoding (`batch_size` N > 1; 0: every prompt at once): up to N prompts in one
generator, right-padded with the model's pad id, which is how the runtime batches
(`Tokenizer.encode_batch`): it masks the trailing pad ids of each row and reads each row's
logits at its own last token. Left padding is not its convention (measured: wrong logits).
A prompt that ends with the pad id cannot be told from padding, so it runs alone. Each row
stops at its own stop token or token budget; the generator runs until every row has stopped.
Forced decode is one prompt at a time (its rewind is the whole batch's).

Options (`--engine-opt key=value`): precision (fp32, int4; default fp32), threads (ONNX
Runtime's intra-op threads; default its own choice), batch_size (default 1), model_path (a
prebuilt ONNX Runtime GenAI folder; then precision only labels it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnxruntime_genai as og

from gate.core.engine import ForcedDecode, PromptInput, parse_options
from gate.core.traces.trace import PromptRecord
from gate.engines._common import (
    Pairs,
    check_forced_ids,
    check_prompt_ids,
    greedy_record,
    host_platform,
    refuse_recurrent,
)
from gate.engines._logits import top_k_pairs
from gate.engines.ortgenai.builder import PRECISIONS, onnx_model, read_onnx_manifest
from gate.errors import InputError
from gate.models.default import DEFAULT_MODEL, materialize_default, resolve_model_path
from gate.models.hashing import source_hashes

OPTIONS: dict[str, tuple[type, Any]] = {
    "precision": (str, "fp32"),
    "threads": (int, None),
    "batch_size": (int, 1),
    "model_path": (str, None),
}


class OrtGenAIEngine:
    """Greedy decoding with ONNX Runtime GenAI; see the module doc for the options."""

    name = "ortgenai"
    # gate.core.engine.SCHEDULE_KNOBS -> the option that sets it (`gate invariance`).
    schedule_knobs: ClassVar[Mapping[str, str]] = {"threads": "threads", "batch_size": "batch_size"}

    def __init__(self, model: str, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        precision = str(opts["precision"]).lower()
        if precision not in PRECISIONS:
            raise InputError(f"--engine-opt precision={opts['precision']}: expected one of {', '.join(PRECISIONS)}")
        if opts["threads"] is not None and opts["threads"] < 1:
            raise InputError(f"--engine-opt threads={opts['threads']}: expected a positive integer")
        if opts["batch_size"] < 0:
            raise InputError(f"--engine-opt batch_size={opts['batch_size']}: expected 0 (all at once) or more")
        self.model_id = model
        self.options = opts
        self.precision = precision
        self.source: Path | None = None
        self.folder = self._locate(model, opts["model_path"])
        self.manifest = read_onnx_manifest(self.folder)
        config = og.Config(str(self.folder))
        config.clear_providers()  # the CPU provider, whatever the folder was built for
        if opts["threads"] is not None:
            overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": int(opts["threads"])}}}}
            config.overlay(json.dumps(overlay))
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)
        genai = json.loads((self.folder / "genai_config.json").read_text(encoding="utf-8"))
        eos = genai.get("model", {}).get("eos_token_id")
        self.stop_ids = frozenset([eos] if isinstance(eos, int) else [int(t) for t in eos or ()])
        pad = genai.get("model", {}).get("pad_token_id")
        self.pad_token_id: int = int(pad) if isinstance(pad, int) else min(self.stop_ids, default=0)
        self.vocab_size: int | None = genai.get("model", {}).get("vocab_size")

    def _locate(self, model: str, model_path: str | None) -> Path:
        """The ONNX Runtime GenAI folder to load: `model_path`, a folder given as the model,
        or the ONNX build of a Hugging Face folder (the default model's, by default)."""
        if model_path:
            folder = Path(model_path).expanduser()
            if not (folder / "genai_config.json").is_file():
                raise InputError(f"--engine-opt model_path={model_path}: no genai_config.json there")
            return folder
        if model == DEFAULT_MODEL:
            self.source = materialize_default()
        else:
            folder = Path(resolve_model_path(model)).expanduser()
            if (folder / "genai_config.json").is_file():
                return folder
            refuse_recurrent(
                "ortgenai",
                folder,
                "gate's forced decode on ONNX Runtime GenAI rewinds the generator by a token (rewind_to), "
                "which a Gated DeltaNet recurrent state cannot undo",
            )
            if not folder.is_dir():
                raise InputError(
                    f"engine 'ortgenai' runs a local model: {model!r} is neither an ONNX Runtime GenAI folder "
                    "nor a Hugging Face folder to build one from (or give --engine-opt model_path=FOLDER)"
                )
            self.source = folder
        return onnx_model(self.source, self.precision)

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        from importlib import metadata

        manifest = self.manifest or {}
        source = manifest.get("source") or {}
        out: dict[str, Any] = {
            "name": self.name,
            "version": og.__version__,
            "onnxruntime_genai": og.__version__,
            "onnxruntime": _version(metadata, "onnxruntime"),
            "precision": manifest.get("precision", self.precision),
            "execution_provider": "cpu",
            "threads": self.options["threads"] if self.options["threads"] is not None else "onnxruntime default",
            "batch_size": self.options["batch_size"],
            "greedy": "og.Generator do_sample=false (std::max_element: first maximum, lowest id)",
            "logprobs": "float64(logit) - logsumexp (float32 exp, float64 sum) over the runtime's float32 logits",
            "options": {k: v for k, v in self.options.items() if v is not None},
            "model": self.model_id,
            "onnx_model_dir": str(self.folder),
            "onnx_model_sha256": manifest.get("model_sha256"),
            **host_platform(),
        }
        # The ONNX model is built from these weights (fp32: the same values widened;
        # int4: quantised by the builder), so a pin recorded from them matches.
        hashes = {k: source[k] for k in ("weights_sha256", "tokenizer_sha256") if isinstance(source.get(k), str)}
        if not hashes and self.source is not None:
            hashes = source_hashes(self.source)
        out.update(hashes)
        if manifest:
            out["builder"] = manifest.get("builder")
        return out

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        for p in prompts:
            check_prompt_ids(p.id, p.prompt_token_ids, self.vocab_size)
        size = max(1, len(prompts) if self.options["batch_size"] == 0 else int(self.options["batch_size"]))
        # A prompt ending with the pad id would lose that token as padding: it runs alone.
        together = [
            i
            for i, p in enumerate(prompts)
            if size > 1 and p.max_tokens > 0 and p.prompt_token_ids[-1:] != (self.pad_token_id,)
        ]
        done: dict[int, PromptRecord] = {}
        for start in range(0, len(together), size):
            group = together[start : start + size]
            done.update(zip(group, self._generate_batch([prompts[i] for i in group], top_k), strict=True))
        return [done[i] if i in done else self._generate_one(p, top_k) for i, p in enumerate(prompts)]

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        check_prompt_ids("forced", prompt_token_ids, self.vocab_size)
        check_forced_ids(token_ids, self.vocab_size)
        chosen: list[int] = []
        tops: list[Pairs] = []
        if token_ids:
            gen = self._generator([prompt_token_ids], len(prompt_token_ids) + len(token_ids))
            for i, fed in enumerate(token_ids):
                token, top = self._step(gen, i, top_k)
                chosen.append(token)
                if top is not None:
                    tops.append(top)
                if i + 1 < len(token_ids):
                    # Undo the runtime's own pick and feed the oracle's token instead.
                    gen.rewind_to(gen.token_count() - 1)
                    gen.append_tokens(np.array([[int(fed)]], dtype=np.int32))
        return ForcedDecode(token_ids=tuple(chosen), top_logprobs=tops if top_k > 0 else None, mode="decode")

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        """The runtime's own tokenizer (and the folder's chat template), as vLLM does it:
        text as it is; messages rendered with the generation prompt, then tokenized."""
        if (text is None) == (messages is None):
            raise InputError("a prompt needs exactly one of text or messages")
        if messages is not None:
            rendered = self.tokenizer.apply_chat_template(
                json.dumps([dict(m) for m in messages]), add_generation_prompt=True
            )
            return tuple(int(t) for t in self.tokenizer.encode(rendered))
        return tuple(int(t) for t in self.tokenizer.encode(text))

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return [self.tokenizer.decode(np.array([int(t)], dtype=np.int32)) for t in ids]

    def close(self) -> None:
        self.tokenizer = None
        self.model = None

    # ------------------------------------------------------------------ the decode loop

    def _generator(self, rows: Sequence[Sequence[int]], max_length: int) -> Any:
        """A greedy generator over `rows` (one per sequence, of equal length), prompts appended."""
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=max_length, batch_size=len(rows))
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.array([list(r) for r in rows], dtype=np.int32))
        return gen

    def _step(self, gen: Any, position: int, top_k: int) -> tuple[int, Pairs | None]:
        """One position: the logits the runtime computed, then its own greedy pick."""
        logits = np.array(gen.get_logits(), dtype=np.float32).reshape(-1)
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        top = top_k_pairs(logits, top_k, token, position=position) if top_k > 0 else None
        return token, top

    def _generate_batch(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        """Up to `batch_size` prompts in one generator, right-padded (see the module doc);
        a batch of one is the one-prompt loop."""
        longest = max(p.max_tokens for p in prompts)
        if longest <= 0:
            return [greedy_record(p, [], [] if top_k > 0 else None, "length", self.decode_tokens([])) for p in prompts]
        width = max(len(p.prompt_token_ids) for p in prompts)
        rows = [[*p.prompt_token_ids, *[self.pad_token_id] * (width - len(p.prompt_token_ids))] for p in prompts]
        gen = self._generator(rows, width + longest)
        ids: list[list[int]] = [[] for _ in prompts]
        tops: list[list[Pairs]] = [[] for _ in prompts]
        finish = ["length"] * len(prompts)
        live = set(range(len(prompts)))
        for step in range(longest):
            logits = np.array(gen.get_logits(), dtype=np.float32).reshape(len(prompts), -1)
            gen.generate_next_token()
            chosen = gen.get_next_tokens()
            for row in sorted(live):
                token = int(chosen[row])
                ids[row].append(token)
                if top_k > 0:
                    tops[row].append(top_k_pairs(logits[row], top_k, token, position=step))
                if token in self.stop_ids:
                    finish[row] = "stop"
                if token in self.stop_ids or len(ids[row]) >= prompts[row].max_tokens:
                    live.discard(row)
            if not live or gen.is_done():
                break
        return [
            greedy_record(p, ids[r], tops[r] if top_k > 0 else None, finish[r], self.decode_tokens(ids[r]))
            for r, p in enumerate(prompts)
        ]

    def _generate_one(self, prompt: PromptInput, top_k: int) -> PromptRecord:
        return self._generate_batch([prompt], top_k)[0]


def _version(metadata: Any, dist: str) -> str | None:
    try:
        return str(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None
