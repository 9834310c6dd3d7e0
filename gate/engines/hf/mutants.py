"""Fault-injecting HF engines for `gate selftest`: each one is a bug an engine could ship.

- `tie-break-highest`: exact ties go to the highest token id instead of the lowest
  (`torch.argmax`'s rule, which the oracle follows); the gate must call every change an
  exact tie with tie_break "higher_id".
- `runner-up+1-step` / `runner-up+4-steps`: at every position the runner-up's logit is
  raised by one (four) steps of the model dtype's grid, the worst perturbation of that
  size: it flips every position whose top-2 gap is at most that many steps. One step is
  what honest engines drift by, so the gate must ratify it (ties and near ties); four steps
  is a real numerical fault and must show up as defects.
- `float16`: the model run in float16 instead of bfloat16; every change must be reported.
- `skip-layer-N`: decoder layer N (the middle one by default) is skipped, its input passed
  through; must show up as defects.
- `stale-recurrent-state` (only on a model with recurrent layers, e.g. Qwen3.5/3.6's Gated
  DeltaNet): each request's prefill starts from the recurrent state the previous request left
  (`gate.engines.hf.stale_state`); must show up as defects.

All are subclasses of `HFEngine` that override only its fault-injection points
(`_logits_hook`) or its options, so the decode loop under test is the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gate.core.calibration.selftest import (
    EXPECT_CAUGHT,
    EXPECT_DEFECT,
    EXPECT_EXACT_TIES,
    EXPECT_NO_DEFECT,
    Mutation,
)
from gate.core.engine import Engine
from gate.engines.hf.engine import HFEngine
from gate.engines.hf.layers import decoder_layers
from gate.engines.hf.schedules import has_recurrent_layers
from gate.engines.hf.stale_state import StaleRecurrentStateHFEngine
from gate.errors import InputError

SEVERAL_STEPS = 4


def runner_up(logits: torch.Tensor) -> int:
    """The token `torch.argmax` would pick if the top one were gone: ties to the lowest id."""
    top = int(torch.argmax(logits))
    masked = logits.clone()
    masked[top] = float("-inf")
    return int(torch.argmax(masked))


def raise_by_steps(value: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """`value` moved `steps` representable numbers of `dtype` towards +inf (crossing a power
    of two, the step size changes with it, as the grid does)."""
    x = value.to(dtype)
    up = torch.full_like(x, float("inf"))
    for _ in range(steps):
        x = torch.nextafter(x, up)
    return x.to(value.dtype)


class RunnerUpNudgedHFEngine(HFEngine):
    """The runner-up's logit raised by `steps` steps of the model dtype's grid."""

    name = "hf-runner-up-nudged"

    def __init__(self, model: str, *, steps: int, **options: Any) -> None:
        super().__init__(model, **options)
        if steps < 1:
            raise InputError(f"runner-up nudge: steps must be >= 1, found {steps}")
        self.steps = steps

    def _logits_hook(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        logits = super()._logits_hook(logits, position)
        r = runner_up(logits)
        out = logits.clone()
        out[r] = raise_by_steps(logits[r], self.steps, self.dtype)
        return out

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"runner-up +{self.steps} {self.dtype} steps"}


class _PassThrough(torch.nn.Module):
    """A decoder layer that returns its input hidden states untouched."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class LayerSkippedHFEngine(HFEngine):
    """One decoder layer skipped: its input goes straight to the next layer."""

    name = "hf-layer-skipped"

    def __init__(self, model: str, *, layer: int | None = None, **options: Any) -> None:
        super().__init__(model, **options)
        layers = decoder_layers(self.model)
        index = len(layers) // 2 if layer is None else layer
        if not 0 <= index < len(layers):
            raise InputError(f"skip layer {index}: the model has {len(layers)} decoder layers")
        layers[index] = _PassThrough()
        self.skipped = index

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"decoder layer {self.skipped} skipped"}


def _with(options: Mapping[str, str], **override: str) -> dict[str, str]:
    return {**options, **override}


def baseline_loader(model: str, options: Mapping[str, str]) -> Callable[[], Engine]:
    """The unmutated HF engine, ties to the lowest id whatever the options say."""
    opts = _with(options, tie_break="lowest")
    return lambda: HFEngine(model, **opts)


def mutations(model: str, options: Mapping[str, str], *, only: Sequence[str] | None = None) -> list[Mutation]:
    """The self-test's faults for the HF engine on `model`, with the user's engine options."""
    opts = _with(options, tie_break="lowest")
    dtype = str(options.get("dtype", "bfloat16"))
    n_layers = _layer_count(model)
    middle = n_layers // 2 if n_layers else None
    skip_name = f"skip-layer-{middle}" if middle is not None else "skip-layer"
    all_mutations = [
        Mutation(
            "tie-break-highest",
            "exact ties broken to the highest token id instead of the lowest",
            EXPECT_EXACT_TIES,
            lambda: HFEngine(model, **_with(opts, tie_break="highest")),
        ),
        Mutation(
            "runner-up+1-step",
            f"the runner-up's logit raised by one {dtype} step at every position",
            EXPECT_NO_DEFECT,
            lambda: RunnerUpNudgedHFEngine(model, steps=1, **opts),
        ),
        Mutation(
            f"runner-up+{SEVERAL_STEPS}-steps",
            f"the runner-up's logit raised by {SEVERAL_STEPS} {dtype} steps at every position",
            EXPECT_DEFECT,
            lambda: RunnerUpNudgedHFEngine(model, steps=SEVERAL_STEPS, **opts),
        ),
        Mutation(
            "float16",
            "the model run in float16 instead of bfloat16",
            EXPECT_CAUGHT,
            lambda: HFEngine(model, **_with(opts, dtype="float16")),
        ),
        Mutation(
            skip_name,
            f"decoder layer {middle if middle is not None else '(middle)'} skipped, its input passed through",
            EXPECT_DEFECT,
            lambda: LayerSkippedHFEngine(model, layer=middle, **opts),
        ),
    ]
    if _recurrent(model):
        all_mutations.append(
            Mutation(
                "stale-recurrent-state",
                "each prompt's prefill starts from the recurrent state the previous request left",
                EXPECT_DEFECT,
                lambda: StaleRecurrentStateHFEngine(model, **opts),
            )
        )
    if not only:
        return all_mutations
    names = {m.name for m in all_mutations}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"--only {unknown[0]!r}: unknown mutant (known: {', '.join(sorted(names))})")
    return [m for m in all_mutations if m.name in set(only)]


def _layer_count(model: str) -> int | None:
    """The model's decoder layer count from its config, without loading weights."""
    from transformers import AutoConfig

    from gate.models.default import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError):
        return None
    n = getattr(config, "num_hidden_layers", None)
    return int(n) if isinstance(n, int) else None


def _recurrent(model: str) -> bool:
    """Whether the model's config declares layers with recurrent state, without loading weights."""
    from transformers import AutoConfig

    from gate.models.default import resolve_model_path

    try:
        return has_recurrent_layers(AutoConfig.from_pretrained(resolve_model_path(model)))
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------- realistic candidates
#
# Builds that are not the reference model within honest noise, of the kinds people ship:
# real model code with its weights, cache, positions or sampler altered. The doctrine study
# (scripts/doctrine_study.py) runs them beside the honest variants; the gate must fail each.

LATE_FROM = 16  # a bias confined to generated positions >= this (a KV-cache block-boundary bug's shape)
SOME_PROMPTS_EVERY = 3  # a bias confined to the prompts whose token ids hash to 0 modulo this
CONFINED_STEPS = 3
REPETITION_PENALTY = 1.02  # vLLM's `repetition_penalty` semantics (prompt and output tokens)


def quantise_rows(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """`weight` [out, in] rounded to signed `bits`-bit integers, symmetric, one scale per
    output channel (per `group` consecutive inputs of it when given), back in its dtype."""
    w = weight.float()
    rows, cols = w.shape
    size = cols if group is None or cols % group else group
    blocks = w.reshape(rows, cols // size, size)
    top = 2 ** (bits - 1) - 1
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / top
    q = torch.clamp(torch.round(blocks / scale), -top, top) * scale
    return q.reshape(rows, cols).to(weight.dtype)


class WeightQuantisedHFEngine(HFEngine):
    """Every decoder Linear weight quantised to int`bits` per output channel (in groups of
    `group` inputs when given) and dequantised: the reference model's code on weights that
    are not its weights (a quantised build). The embeddings and the LM head stay."""

    name = "hf-weights-quantised"

    def __init__(self, model: str, *, bits: int, group: int | None = None, **options: Any) -> None:
        super().__init__(model, **options)
        if bits not in (4, 8):
            raise InputError(f"weight quantisation: bits must be 4 or 8, found {bits}")
        self.bits, self.group = bits, group
        count = 0
        with torch.no_grad():
            for module in decoder_layers(self.model).modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(quantise_rows(module.weight, bits, group))
                    count += 1
        self.quantised = count

    def info(self) -> dict[str, Any]:
        per = f"per {self.group} inputs of each output channel" if self.group else "per output channel"
        return {**super().info(), "mutation": f"{self.quantised} decoder Linear weights int{self.bits} {per}"}


def fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x through float8 e4m3 and back (one scale of 1: values in |x| <= 448 as vLLM's
    `kv_cache_dtype=fp8_e4m3` with the default scale)."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def int8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x ([..., head_dim]) through int8, one symmetric scale per token and head, and back."""
    f = x.float()
    scale = f.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
    return (torch.clamp(torch.round(f / scale), -127, 127) * scale).to(x.dtype)


KV_ROUND_TRIPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fp8": fp8_round_trip,
    "int8": int8_round_trip,
}


class KVQuantisedHFEngine(HFEngine):
    """Keys and values stored in the KV cache through a lossy round trip (fp8 e4m3, or int8
    per token and head): every attention reads the cache as stored, the current token's
    own entry included, as a quantised KV cache does."""

    name = "hf-kv-quantised"

    def __init__(self, model: str, *, kv: str, **options: Any) -> None:
        super().__init__(model, **options)
        if kv not in KV_ROUND_TRIPS:
            raise InputError(f"KV-cache quantisation: expected one of {', '.join(KV_ROUND_TRIPS)}, found {kv!r}")
        self.kv = kv

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        from transformers import DynamicCache

        round_trip = KV_ROUND_TRIPS[self.kv]

        class _RoundTripCache(DynamicCache):
            def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
                return super().update(round_trip(key_states), round_trip(value_states), layer_idx, *args, **kwargs)

        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        self._seq = 0
        cache = _RoundTripCache(config=self.model.config)
        out = self._forward(ids, input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1], out.past_key_values

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"KV cache round-tripped through {self.kv}"}


class DecodePositionShiftedHFEngine(HFEngine):
    """Every decode step fed at position seq_len + `shift` (RoPE), the prefill at the right
    ones: an off-by-one in the decode path only."""

    name = "hf-decode-position-shifted"

    def __init__(self, model: str, *, shift: int = 1, **options: Any) -> None:
        super().__init__(model, **options)
        self.shift = shift

    def _decode(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        pos = torch.tensor([[cache.get_seq_length() + self.shift]], dtype=torch.long, device=self.device)
        out = self._forward(ids, input_ids=ids, past_key_values=cache, use_cache=True, position_ids=pos)
        return out.logits[0, -1], out.past_key_values

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"decode positions off by {self.shift} (prefill right)"}


class _ContextSeen(HFEngine):
    """Keeps the token ids of the context being decoded: the prompt, then every fed token."""

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        self.context: list[int] = [int(t) for t in prompt_ids]
        return super()._prefill(prompt_ids)

    def _decode(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        self.context.append(int(token))
        return super()._decode(token, cache)


def prompt_selected(prompt_ids: Sequence[int], every: int) -> bool:
    """The same answer for a prompt in the free run and in forcing (its ids, not its order)."""
    import zlib

    return zlib.crc32(",".join(str(int(t)) for t in prompt_ids).encode()) % every == 0


class ConfinedRunnerUpHFEngine(_ContextSeen):
    """The runner-up raised by `steps` grid steps, but only at generated positions >=
    `from_position`, or only on the prompts `prompt_selected` picks: a defect that a run's
    median over every position dilutes."""

    name = "hf-runner-up-confined"

    def __init__(self, model: str, *, steps: int, from_position: int = 0, every: int = 1, **options: Any) -> None:
        super().__init__(model, **options)
        self.steps, self.from_position, self.every = steps, from_position, every

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        self.selected = self.every <= 1 or prompt_selected(prompt_ids, self.every)
        return super()._prefill(prompt_ids)

    def _logits_hook(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        logits = super()._logits_hook(logits, position)
        if position < self.from_position or not self.selected:
            return logits
        r = runner_up(logits)
        out = logits.clone()
        out[r] = raise_by_steps(logits[r], self.steps, self.dtype)
        return out

    def info(self) -> dict[str, Any]:
        where = f"positions >= {self.from_position}" if self.from_position else "every position"
        some = f", on the prompts whose ids hash to 0 mod {self.every}" if self.every > 1 else ""
        return {**super().info(), "mutation": f"runner-up +{self.steps} {self.dtype} steps at {where}{some}"}


class PenalisedSamplerHFEngine(_ContextSeen):
    """Chooses under a repetition penalty (vLLM's: a logit of a token already in the prompt
    or the output divided by `penalty` when positive, multiplied when not) but reports the
    raw logprobs: not greedy over the logprobs it reports (vLLM's default `logprobs_mode`)."""

    name = "hf-penalised-sampler"

    def __init__(self, model: str, *, penalty: float = REPETITION_PENALTY, **options: Any) -> None:
        super().__init__(model, **options)
        self.penalty = penalty

    def _pick(self, logits: torch.Tensor) -> int:
        seen = torch.tensor(sorted(set(self.context)), dtype=torch.long, device=logits.device)
        out = logits.clone()
        v = out[seen]
        out[seen] = torch.where(v > 0, v / self.penalty, v * self.penalty)
        return super()._pick(out)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": f"repetition penalty {self.penalty} in the choice, raw logprobs reported"}


def realistic_mutations(model: str, options: Mapping[str, str]) -> list[Mutation]:
    """Builds that are not the reference model within honest noise (the doctrine study's
    realistic candidates); each must fail the gate (`EXPECT_DEFECT`: at least not a pass)."""
    opts: dict[str, Any] = _with(options, tie_break="lowest")
    late, some = LATE_FROM, SOME_PROMPTS_EVERY
    return [
        Mutation(
            "weights-int8",
            "decoder Linear weights int8 per output channel",
            EXPECT_DEFECT,
            lambda: WeightQuantisedHFEngine(model, bits=8, **opts),
        ),
        Mutation(
            "weights-int4",
            "decoder Linear weights int4 per output channel, in groups of 32 inputs",
            EXPECT_DEFECT,
            lambda: WeightQuantisedHFEngine(model, bits=4, group=32, **opts),
        ),
        Mutation(
            "kv-fp8", "KV cache through fp8 e4m3", EXPECT_DEFECT, lambda: KVQuantisedHFEngine(model, kv="fp8", **opts)
        ),
        Mutation(
            "kv-int8",
            "KV cache through int8 per token and head",
            EXPECT_DEFECT,
            lambda: KVQuantisedHFEngine(model, kv="int8", **opts),
        ),
        Mutation(
            "decode-position+1",
            "decode positions off by one (prefill right)",
            EXPECT_DEFECT,
            lambda: DecodePositionShiftedHFEngine(model, shift=1, **opts),
        ),
        Mutation(
            f"runner-up+{CONFINED_STEPS}-late",
            f"runner-up +{CONFINED_STEPS} steps at generated positions >= {late}",
            EXPECT_DEFECT,
            lambda: ConfinedRunnerUpHFEngine(model, steps=CONFINED_STEPS, from_position=late, **opts),
        ),
        Mutation(
            f"runner-up+{CONFINED_STEPS}-some-prompts",
            f"runner-up +{CONFINED_STEPS} steps on every {some}rd prompt (by its ids' hash)",
            EXPECT_DEFECT,
            lambda: ConfinedRunnerUpHFEngine(model, steps=CONFINED_STEPS, every=some, **opts),
        ),
        Mutation(
            "penalised-sampler",
            f"repetition penalty {REPETITION_PENALTY} in the choice, raw logprobs reported",
            EXPECT_DEFECT,
            lambda: PenalisedSamplerHFEngine(model, **opts),
        ),
    ]
