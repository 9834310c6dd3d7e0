"""A pin for a tiny random Llama, recorded by the HF engine: for the doctrine's slow tests.

The model (tests/helpers/tiny_models.py, lm_head scaled x20) has logits at |logit| 8-16 like a
trained model's (bf16 steps of 62.5 mnats), so a 16-prompt suite has a handful of exact
top-2 ties and top-2 gaps of a few grid steps. Built in seconds, nothing downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL = "tiny/llama-doctrine"
PROMPTS = 16
MAX_TOKENS = 24


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the duration: on a shared 2-core machine, two OpenMP threads
    that wait on each other run a decode loop an order of magnitude slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


HYBRID_MODEL = "tiny/qwen3.5-moe-hybrid"
HYBRID_PROMPTS = 8
HYBRID_MAX_TOKENS = 12


def build_tiny_hybrid_pin(root: Path) -> tuple[Path, Path]:
    """(weights folder, pins root) with a recorded pin of HYBRID_MODEL under root: the tiny
    Qwen3.5-MoE (3 Gated DeltaNet layers + 1 gated attention layer, bfloat16, lm_head x20,
    DeltaNet states that decay slowly, as a trained model's long-memory heads do),
    its prompts long enough (about 90 tokens) to cross the gated delta rule's 64-token chunk,
    sharing their first 40 characters (what a prefix cache reuses). Routing is not recorded:
    the pin is for the schedules (`gate invariance`), which batch and cache prompts."""
    from gate.core.pins.oracle_settings import OracleSettings
    from gate.core.pins.pin import PinFolder, write_pin
    from gate.core.pins.suite import Suite, SuitePrompt
    from gate.engines.hf.engine import HFEngine
    from gate.workflows.pins.record import record_oracle
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    weights = build_tiny_qwen3_5_moe(root / "weights", seed=4, lm_head_scale=20.0, decay=(0.002, 0.05))
    pins = root / "pins"
    text = "The farm wakes before the sun, and then {i} hens, {j} geese and one old dog walk the long fence home."
    suite = Suite(
        tuple(SuitePrompt(id=f"h{i:02d}", text=text.format(i=i, j=i * 7 + 3)) for i in range(HYBRID_PROMPTS))
    ).resolved(HYBRID_MAX_TOKENS)
    settings = OracleSettings(model=HYBRID_MODEL, engine="hf", max_tokens=HYBRID_MAX_TOKENS, top_k=5)
    engine = HFEngine(str(weights), record_routing="false")
    try:
        trace = record_oracle(engine, model=HYBRID_MODEL, suite=suite, settings=settings, model_source=str(weights))
    finally:
        engine.close()
    folder = PinFolder(model=HYBRID_MODEL, root=pins)
    folder.path.mkdir(parents=True)
    write_pin(folder, suite, settings, trace, force=False)
    return weights, pins


def build_tiny_pin(root: Path) -> tuple[Path, Path]:
    """(weights folder, pins root) with a recorded pin of MODEL under root."""
    from gate.core.pins.oracle_settings import OracleSettings
    from gate.core.pins.pin import PinFolder, write_pin
    from gate.core.pins.suite import Suite, SuitePrompt
    from gate.engines.hf.engine import HFEngine
    from gate.workflows.pins.record import record_oracle
    from helpers.tiny_models import build_tiny_llama

    weights = build_tiny_llama(root / "weights", seed=1, lm_head_scale=20.0)
    pins = root / "pins"
    suite = Suite(
        tuple(SuitePrompt(id=f"p{i:02d}", text=f"The quick {i} brown fox number {i * 7}") for i in range(PROMPTS))
    ).resolved(MAX_TOKENS)
    settings = OracleSettings(model=MODEL, engine="hf", max_tokens=MAX_TOKENS, top_k=5)
    engine = HFEngine(str(weights))
    try:
        trace = record_oracle(engine, model=MODEL, suite=suite, settings=settings, model_source=str(weights))
    finally:
        engine.close()
    folder = PinFolder(model=MODEL, root=pins)
    folder.path.mkdir(parents=True)
    write_pin(folder, suite, settings, trace, force=False)
    return weights, pins
