"""The HF engine on tiny models built at test time: tie-break, KV-cache decode loop,
teacher-forced decode, top-k lists, options, tokenization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.tiny_models import EOS_ID, TIE_HIGH, TIE_LOW  # noqa: E402

from gate.core.engine import Engine, PromptInput  # noqa: E402
from gate.core.traces.reader import read_trace  # noqa: E402
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, write_trace  # noqa: E402
from gate.core.traces.validate import check_top_logprobs  # noqa: E402
from gate.core.verdict.adjudicate import compare  # noqa: E402
from gate.core.verdict.doctrine import Doctrine  # noqa: E402
from gate.engines.hf.engine import HFEngine, top_k_pairs  # noqa: E402
from gate.errors import InputError, TraceError  # noqa: E402

TEXTS = ("import numpy as np", "The capital of France is", "1, 2, 3, 4,", "def main():\n    ")
TOP_K = 5


def prompts(engine: HFEngine, n_tokens: int = 16) -> list[PromptInput]:
    out = []
    for i, text in enumerate(TEXTS):
        ids = engine.encode(text)
        assert ids is not None
        out.append(PromptInput(f"p{i}", ids, n_tokens, prompt=text))
    return out


def trace(role: str, records: Sequence[PromptRecord], top_k: int = TOP_K) -> Trace:
    return Trace(TraceHeader(role, "tiny", top_k, {"name": "hf", "version": "test"}), tuple(records))


def with_forced(candidate: HFEngine, oracle: Sequence[PromptRecord], top_k: int = TOP_K) -> list[PromptRecord]:
    """The candidate's free run plus its teacher-forced choices on the oracle's tokens."""
    records = candidate.generate([PromptInput(o.id, o.prompt_token_ids, len(o.token_ids)) for o in oracle], top_k)
    return [
        replace(c, forced_token_ids=candidate.force(o.prompt_token_ids, o.token_ids, top_k).token_ids)
        for c, o in zip(records, oracle, strict=True)
    ]


@pytest.fixture(scope="module")
def llama(llama_path: Path) -> HFEngine:
    return HFEngine(str(llama_path))


@pytest.fixture(scope="module")
def qwen3_5(qwen3_5_moe_path: Path) -> HFEngine:
    return HFEngine(str(qwen3_5_moe_path))


# --------------------------------------------------------------------------- tie-break (RED first)


def exact_ties_not_won_by_lowest(records: Sequence[PromptRecord]) -> tuple[int, list[tuple[str, int]]]:
    """(exact top-2 ties seen, the (prompt, position) where the lowest tied id was not chosen)."""
    seen = 0
    wrong = []
    for rec in records:
        assert rec.top_logprobs is not None
        for i, top in enumerate(rec.top_logprobs):
            best = top[0][1]
            tied = [t for t, lp in top if lp == best]
            if len(tied) > 1:
                seen += 1
                if rec.token_ids[i] != min(tied):
                    wrong.append((rec.id, i))
    return seen, wrong


@pytest.mark.parametrize(("tie_break", "expect_wrong"), [("lowest", False), ("highest", True)])
def test_exact_ties_go_to_the_lowest_token_id(tie_model_path: Path, tie_break: str, expect_wrong: bool) -> None:
    """Every position of the tie model is an exact tie between TIE_LOW < TIE_HIGH. The lowest
    id must win; run under the highest-id rule, the very same check fails at every position."""
    engine = HFEngine(str(tie_model_path), tie_break=tie_break)
    records = engine.generate(prompts(engine, 8), TOP_K)
    seen, wrong = exact_ties_not_won_by_lowest(records)
    assert seen == sum(len(r.token_ids) for r in records) == len(TEXTS) * 8  # the check is not vacuous
    for rec in records:
        assert rec.top_logprobs is not None
        for top in rec.top_logprobs:
            assert [top[0][0], top[1][0]] == [TIE_LOW, TIE_HIGH]
            assert top[0][1] == top[1][1]  # bit-identical
    if expect_wrong:
        assert len(wrong) == seen
        assert {t for r in records for t in r.token_ids} == {TIE_HIGH}
    else:
        assert wrong == []
        assert {t for r in records for t in r.token_ids} == {TIE_LOW}


def test_the_trace_reader_rejects_a_highest_id_oracle(tie_model_path: Path) -> None:
    """An oracle that broke a tie toward the higher id is inconsistent by the spec."""
    engine = HFEngine(str(tie_model_path), tie_break="highest")
    rec = engine.generate(prompts(engine, 2)[:1], TOP_K)[0]
    with pytest.raises(TraceError, match="exact tie"):
        check_top_logprobs("t", 1, [list(map(list, top)) for top in rec.top_logprobs or ()], rec.token_ids, oracle=True)


def test_the_gate_calls_the_highest_id_rule_exact_ties(tie_model_path: Path) -> None:
    oracle = HFEngine(str(tie_model_path))
    candidate = HFEngine(str(tie_model_path), tie_break="highest")
    o = oracle.generate(prompts(oracle, 4), TOP_K)
    result = compare(trace("oracle", o), trace("candidate", with_forced(candidate, o)))
    assert result.verdict == "ratified_pass"
    assert result.counts["exact_ties"] == len(TEXTS) * 4  # forced data: every position, not just the first
    assert {(d.cls, d.tie_break) for d in result.divergences} == {("exact_tie", "higher_id")}


# --------------------------------------------------------------------------- the decode loop


def test_generate_matches_transformers_generate(llama: HFEngine) -> None:
    for p in prompts(llama)[:2]:
        ours = llama.generate([p], 0)[0]
        ids = torch.tensor([list(p.prompt_token_ids)])
        theirs = llama.model.generate(ids, max_new_tokens=p.max_tokens, do_sample=False, pad_token_id=EOS_ID)
        assert list(ours.token_ids) == theirs[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("model", ["llama", "qwen3_5_moe"])
def test_force_on_its_own_tokens_reproduces_generate_bit_for_bit(
    model: str, llama: HFEngine, qwen3_5: HFEngine
) -> None:
    engine = llama if model == "llama" else qwen3_5
    # The Gated DeltaNet layers run transformers' slow reference kernels on CPU: fewer tokens.
    batch = prompts(engine, 16) if model == "llama" else prompts(engine, 8)[:2]
    for rec in engine.generate(batch, TOP_K):
        forced = engine.force(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.mode == "decode"
        assert forced.token_ids == rec.token_ids
        assert forced.top_logprobs == rec.top_logprobs  # floats compared exactly
        assert forced.extra["token_logits"] == rec.token_logits


def test_force_feeds_the_oracle_tokens(llama: HFEngine) -> None:
    """Position i of a forced decode sees the prompt plus the given tokens[:i]: its choice is
    what a fresh generation from exactly that context picks first."""
    p = prompts(llama)[0]
    foreign = tuple(ord(c) for c in " and then some text")
    forced = llama.force(p.prompt_token_ids, foreign, TOP_K)
    assert len(forced.token_ids) == len(foreign)
    assert forced.token_ids != llama.generate([replace(p, max_tokens=len(foreign))], 0)[0].token_ids
    assert forced.top_logprobs is not None
    for i in (0, 3, len(foreign) - 1):
        fresh = llama.generate([PromptInput("x", p.prompt_token_ids + foreign[:i], 1)], TOP_K)[0]
        assert fresh.token_ids[0] == forced.token_ids[i]
        assert fresh.top_logprobs is not None
        # A fresh prefill and a decode step are different kernels: close, not identical.
        assert fresh.top_logprobs[0][0][0] == forced.top_logprobs[i][0][0]
        assert abs(fresh.top_logprobs[0][0][1] - forced.top_logprobs[i][0][1]) < 0.05


def test_records_are_valid_oracle_traces(llama: HFEngine, tmp_path: Path) -> None:
    records = llama.generate(prompts(llama), TOP_K)
    write_trace(tmp_path / "o.jsonl", trace("oracle", records))
    back = read_trace(tmp_path / "o.jsonl", role="oracle")  # the reader checks order and greedy consistency
    assert [r.token_ids for r in back.records] == [r.token_ids for r in records]
    for rec in back.records:
        assert rec.top_logprobs is not None
        assert all(len(top) == TOP_K for top in rec.top_logprobs)
        assert rec.finish_reason == "length"
        assert rec.tokens is not None and len(rec.tokens) == len(rec.token_ids)
        logits = rec.token_logits
        assert len(logits) == len(rec.token_ids)
        # Raw bf16 logits, not logprobs: each is a bf16 value.
        assert all(float(torch.tensor(x).bfloat16().float()) == x for x in logits)


def test_eos_stops_generation_but_not_forced_decode(eos_model_path: Path) -> None:
    engine = HFEngine(str(eos_model_path))
    rec = engine.generate(prompts(engine, 8)[:1], TOP_K)[0]
    assert rec.token_ids == (EOS_ID,)
    assert rec.finish_reason == "stop"
    forced = engine.force(rec.prompt_token_ids, (65, 66, 67), TOP_K)
    assert forced.token_ids == (EOS_ID, EOS_ID, EOS_ID)


def test_zero_top_k_and_zero_tokens(llama: HFEngine) -> None:
    p = prompts(llama)[0]
    assert llama.generate([p], 0)[0].top_logprobs is None
    empty = llama.generate([replace(p, max_tokens=0)], TOP_K)[0]
    assert empty.token_ids == () and empty.top_logprobs == []
    assert llama.force(p.prompt_token_ids, (), TOP_K).token_ids == ()


# --------------------------------------------------------------------------- top-k lists


def test_top_k_is_exact_at_a_tie_on_the_k_th_place() -> None:
    logprobs = torch.tensor([-3.0, -1.0, -2.0, -2.0, -2.0, -0.5])
    assert top_k_pairs(logprobs, 3, chosen=5) == [[5, -0.5], [1, -1.0], [2, -2.0]]
    # The chosen token is added when it is outside the top k (as vLLM does).
    assert top_k_pairs(logprobs, 2, chosen=0) == [[5, -0.5], [1, -1.0], [0, -3.0]]
    assert top_k_pairs(logprobs, 99, chosen=5)[-1] == [0, -3.0]


@pytest.mark.parametrize("tied", [3, 40])  # a tie group inside torch.topk's margin, and past it
def test_top_k_takes_the_lowest_ids_of_a_large_tie_group(tied: int) -> None:
    logprobs = torch.full((1000,), -20.0)
    group = 10 + torch.randperm(990, generator=torch.Generator().manual_seed(0))[:tied]
    logprobs[group] = -5.0
    logprobs[7] = -1.0
    top = top_k_pairs(logprobs, 4, chosen=7)
    assert top == [[7, -1.0]] + [[int(t), -5.0] for t in sorted(group.tolist())[:3]]


def test_logprobs_are_log_softmax_of_float32_logits(llama: HFEngine) -> None:
    p = prompts(llama)[0]
    rec = llama.generate([replace(p, max_tokens=1)], TOP_K)[0]
    with torch.inference_mode():
        logits = llama.model(torch.tensor([list(p.prompt_token_ids)])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert rec.top_logprobs is not None
    for t, lp in rec.top_logprobs[0]:
        assert lp == float(expected[t])


# --------------------------------------------------------------------------- options and text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": "red"}, "unknown option"),
        ({"dtype": "int8"}, "dtype"),
        ({"tie_break": "random"}, "tie_break"),
        ({"device": "tpu"}, "device"),
        ({"trust_remote_code": "maybe"}, "expected bool"),
    ],
)
def test_bad_options_are_input_errors(llama_path: Path, options: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        HFEngine(str(llama_path), **options)


def test_a_missing_model_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot load model"):
        HFEngine(str(tmp_path / "nowhere"))


def test_float32_option_and_info(llama_path: Path) -> None:
    engine = HFEngine(str(llama_path), dtype="float32")
    assert isinstance(engine, Engine)
    info = engine.info()
    assert info["name"] == "hf" and info["dtype"] == "float32" and info["device"] == "cpu"
    assert {"version", "torch", "transformers", "model_path", "platform"} <= set(info)
    rec = engine.generate(prompts(engine, 4)[:1], TOP_K)[0]
    assert len(rec.token_ids) == 4


def test_encode_text_and_chat_messages(llama: HFEngine) -> None:
    assert llama.encode("hi") == (ord("h"), ord("i"))
    chat = llama.encode(messages=[{"role": "user", "content": "hi"}])
    assert chat is not None
    assert "".join(llama.decode_tokens(chat) or []) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(InputError):
        llama.encode()


# --------------------------------------------------------------------------- Qwen3.5 (hybrid MoE)


def test_qwen3_5_moe_gated_against_itself(qwen3_5: HFEngine, qwen3_5_moe_path: Path) -> None:
    """The hybrid architecture (Gated DeltaNet recurrent state + attention KV cache) through
    the whole gate: the highest-id rule is caught as exact ties only, and running float32
    instead of bf16 is seen (a different model numerically), with forced decode covering
    every position."""
    oracle = qwen3_5.generate(prompts(qwen3_5, 10)[:3], TOP_K)
    o = trace("oracle", oracle)

    highest = compare(o, trace("candidate", with_forced(HFEngine(str(qwen3_5_moe_path), tie_break="highest"), oracle)))
    assert highest.counts["exact_ties"] > 0
    assert highest.counts["defects"] == highest.counts["near_ties"] == 0
    assert {d.tie_break for d in highest.divergences} == {"higher_id"}

    f32 = compare(o, trace("candidate", with_forced(HFEngine(str(qwen3_5_moe_path), dtype="float32"), oracle)))
    assert f32.verdict != "strict_pass", f32.summary
    assert f32.counts["exact_ties"] == 0  # not a tie-break difference: the numbers moved
    assert compare(o, trace("candidate", oracle), Doctrine()).verdict == "strict_pass"


def test_the_conv_read_stands_in_for_split_only_from_a_deltanets_start_to_its_split(qwen3_5: HFEngine) -> None:
    """The conv1d read stands in for torch.split and Tensor.split from each DeltaNet's forward's
    start until the split of its conv output: the gated delta rule after it (read at the
    norm's input) and everything outside the DeltaNets (lm_head) run with torch's own, no
    function mode is entered, the conv is still read on both paths, and a forward that
    raises inside a DeltaNet leaves torch's own behind."""
    from torch.overrides import _get_current_function_mode_stack

    from gate.core.diagnosis.capture import LA_CONV
    from gate.engines.hf.capture import capture_hf

    model = qwen3_5.model
    assert model is not None
    own = (torch.split, torch.Tensor.split)
    seen: dict[str, list[bool]] = {"lm_head": [], "norm": [], "in_proj_z": [], "modes": []}

    def looked(where: str) -> Any:
        def hook(*args: Any) -> None:
            seen[where].append((torch.split, torch.Tensor.split) == own)
            seen["modes"].append(len(_get_current_function_mode_stack()) == 0)

        return hook

    deltanet = next(m for m in model.modules() if hasattr(m, "conv_dim") and hasattr(m, "in_proj_z"))
    handles = [
        model.get_output_embeddings().register_forward_pre_hook(looked("lm_head")),
        deltanet.norm.register_forward_pre_hook(looked("norm")),
        deltanet.in_proj_z.register_forward_hook(looked("in_proj_z")),
    ]
    ids = list(range(5, 13))
    try:
        for path in ("prefill", "decode"):
            cap = capture_hf(qwen3_5, ids[:6], ids, path)
            assert any(t.point.part == LA_CONV for t in cap.tensors), path
    finally:
        for h in handles:
            h.remove()
    assert seen["lm_head"] and set(seen["lm_head"]) == {True}, seen  # outside every DeltaNet: torch's own
    assert seen["norm"] and set(seen["norm"]) == {True}, seen  # after the split: torch's own
    assert seen["in_proj_z"] and set(seen["in_proj_z"]) == {False}, seen  # before it: the stand-ins
    assert set(seen["modes"]) == {True}

    def boom(module: Any, args: Any, out: Any) -> None:
        raise RuntimeError("planted")

    failing = deltanet.in_proj_z.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="planted"):
            capture_hf(qwen3_5, ids, ids, "prefill")
    finally:
        failing.remove()
    assert (torch.split, torch.Tensor.split) == own


def test_its_capabilities_are_the_contracts_protocols(llama: HFEngine) -> None:
    from gate.core.engine import CapturesPaths
    from gate.engine import CapturesActivations, ForcesDecode, HasScheduleKnobs, ReplaysRouting

    for capability in (ForcesDecode, HasScheduleKnobs, ReplaysRouting, CapturesActivations, CapturesPaths):
        assert isinstance(llama, capability), capability.__name__
    assert isinstance(HFEngine, HasScheduleKnobs)  # read from the class, before any model loads
    context = llama.encode("The capital of France is") or ()
    acts = llama.capture_activations(context)
    layers = llama.model.config.num_hidden_layers
    assert {f"model.layers.{i}" for i in range(layers)} <= set(acts)
    assert all(a.shape[0] == len(context) and a.dtype == np.float32 for a in acts.values())
    only = llama.capture_activations(context, names=["model.layers.0"])
    assert list(only) == ["model.layers.0"] and np.array_equal(only["model.layers.0"], acts["model.layers.0"])


def test_the_reference_engine_and_its_mutants_come_through_the_registry() -> None:
    """What the workflows reach without importing a backend: the registry's reference engine
    captures and widens (`CapturesReference`), its mutants build the self-test's faults, and the
    modules gate diagnose's cache keys on exist."""
    import importlib.util

    from gate.core.engine import CapturesReference
    from gate.engines import registry

    assert registry.resolve(registry.REFERENCE) is HFEngine
    assert issubclass(HFEngine, CapturesReference)
    built = registry.mutants()
    assert callable(built.mutations) and callable(built.baseline_loader)
    assert all(importlib.util.find_spec(name) is not None for name in registry.REFERENCE_SOURCES)
