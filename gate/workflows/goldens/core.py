"""Goldens, the run: record an engine's own greedy outputs over a pin's prompts, or re-run
it and judge every golden that moved (the files and the judging: `gate.core.goldens.golden`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gate.core.engine import Engine
from gate.core.goldens.golden import (
    check_golden_against_pin,
    engine_summary,
    golden_header,
    golden_record,
    option_changes,
    pin_reference,
)
from gate.core.goldens.moves import GoldenMove, GoldensResult, find_moves
from gate.core.pins.pin import Pin
from gate.core.storage.files import portable
from gate.core.traces.machine import describe, machine_of, same_machine
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.adjudicate import oracle_dtype
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.evidence import run_drift
from gate.core.verdict.grid import grid_step
from gate.errors import PinError
from gate.workflows.common.engine_calls import decode_tokens, engine_call
from gate.workflows.common.progress import QUIET, Progress
from gate.workflows.common.provenance import (
    HASH_KEYS,
    check_prompt_tokens,
    check_provenance,
    model_hashes,
    project_commit,
)
from gate.workflows.run.core import run_candidate


def check_golden_provenance(golden: Trace, info: Mapping[str, Any], engine_name: str) -> None:
    """The same engine, and the same weights and tokenizer where the golden and the engine
    both report a hash; a difference is a provenance mismatch (exit 2), not a move."""
    recorded = str(golden.header.engine.get("name", ""))
    running = str(info.get("name", engine_name))
    if recorded and recorded != running:
        raise PinError(
            f"{golden.path}: the golden was recorded by engine {recorded!r}, this run uses {running!r}: "
            "goldens hold one engine's own outputs"
        )
    now = model_hashes(info)
    for key in HASH_KEYS:
        was = golden.header.extra.get(key)
        if was and now.get(key) and was != now[key]:
            what = key.removesuffix("_sha256")
            raise PinError(
                f"provenance mismatch: {golden.path} was recorded on {what} {was}, the engine now runs {now[key]}"
            )


def golden_records(engine: Engine, run: Trace) -> tuple[PromptRecord, ...]:
    """The golden's records of a free run, with the engine's token text where the run has none."""
    return tuple(
        golden_record(r, decode_tokens(engine, r.token_ids) if r.tokens is None and r.token_ids else None)
        for r in run.records
    )


def with_token_texts(engine: Engine, moves: Sequence[GoldenMove]) -> tuple[GoldenMove, ...]:
    """Fill the text of the old, new and oracle tokens of each move where it is missing."""
    wanted = sorted(
        {
            t
            for m in moves
            for t, text in ((m.old_token, m.old_text), (m.new_token, m.new_text), (m.oracle_token, m.oracle_text))
            if t is not None and text is None
        }
    )
    texts = decode_tokens(engine, wanted) if wanted else None
    if texts is None:
        return tuple(moves)
    text = dict(zip(wanted, texts, strict=True))

    def fill(token: int | None, have: str | None) -> str | None:
        return have if have is not None or token is None else text.get(token)

    return tuple(
        replace(
            m,
            old_text=fill(m.old_token, m.old_text),
            new_text=fill(m.new_token, m.new_text),
            oracle_text=fill(m.oracle_token, m.oracle_text),
        )
        for m in moves
    )


def record_golden(
    engine: Engine,
    pin: Pin,
    *,
    options: Mapping[str, str],
    path: str = "<golden>",
    progress: Progress = QUIET,
    check_hashes: bool = True,
) -> Trace:
    """Run the engine greedily over the pinned prompts and return the golden (not yet written)."""
    info = engine_call(engine, "info", engine.info)
    if check_hashes:
        check_provenance(pin, info, where=f"engine {engine.name!r}")
    check_prompt_tokens(engine, pin)
    run = run_candidate(engine, pin, progress=progress, info=info)
    header = golden_header(pin=pin, info=info, options=options, git=project_commit(), hashes=model_hashes(info))
    return Trace(header=header, records=golden_records(engine, run), path=path)


def check_golden(
    engine: Engine,
    pin: Pin,
    golden: Trace,
    doctrine: Doctrine,
    *,
    options: Mapping[str, str],
    progress: Progress = QUIET,
    check_hashes: bool = True,
) -> tuple[GoldensResult, Trace]:
    """Re-run the engine over the pinned prompts and judge every golden that moved.

    Returns the result and the fresh golden (what `--accept` writes)."""
    check_golden_against_pin(golden, pin)
    info = engine_call(engine, "info", engine.info)
    check_golden_provenance(golden, info, engine.name)
    if check_hashes:
        check_provenance(pin, info, where=f"engine {engine.name!r}")
    check_prompt_tokens(engine, pin)
    run = run_candidate(engine, pin, progress=progress, info=info)
    # A golden reproduces bit for bit only on the machine key that recorded it; elsewhere
    # honest numbers move and the moves are judged by the pin's doctrine.
    golden_machine = machine_of(golden.header.engine, golden.header.extra)
    machine = machine_of(info)
    other = same_machine(golden_machine, machine) is False
    drift = None
    evidence = doctrine.evidence
    if evidence is not None:
        dtype = doctrine.dtype or oracle_dtype(pin.trace)
        doctrine = replace(doctrine, dtype=dtype)
        drift = run_drift(
            pin.trace, run, lambda v: grid_step(evidence.unit_logit(v), dtype), limit_ulps=evidence.drift_ulps
        )
    moves = with_token_texts(engine, find_moves(golden, run, pin.trace, doctrine, other_machine=other, drift=drift))
    fresh = Trace(
        header=golden_header(pin=pin, info=info, options=options, git=project_commit(), hashes=model_hashes(info)),
        records=golden_records(engine, run),
        path=golden.path,
    )
    ref = pin_reference(pin)
    recorded = golden.header.extra.get("pin")
    notes = []
    if moves and not golden_machine:
        notes.append(
            "the golden does not record the hardware it was made on: every move counts, as on the recording machine"
        )
    elif moves and other:
        notes.append(
            f"checked on another machine ({describe(machine)}; the golden: {describe(golden_machine)}): "
            "honest numbers move between machines, so moves are judged by the pin's doctrine"
        )
    if drift is not None and drift.beyond:
        notes.append(drift.line() + ": beyond the doctrine, far more than honest engines drift")
    if isinstance(recorded, Mapping) and recorded.get("sha256") and recorded.get("sha256") != ref.get("sha256"):
        notes.append(
            f"the pin has changed since the golden was recorded (sha256 {str(recorded.get('sha256'))[:12]}... then, "
            f"{str(ref.get('sha256'))[:12]}... now): causes are judged against the pin as it is now"
        )
    # Engines that report no options of their own (most plugins): the command line's.
    changes = option_changes(
        golden.header.engine, info, _mapping_or_none(golden.header.extra.get("engine_options")), portable(options)
    )
    result = GoldensResult(
        model=pin.model,
        engine=engine.name,
        golden_path=golden.path,
        prompts=len(golden.records),
        positions=sum(len(r.token_ids) for r in golden.records),
        moves=moves,
        doctrine=doctrine,
        golden_engine=engine_summary(golden.header.engine),
        candidate_engine=engine_summary(info),
        option_changes=changes,
        pin={**ref, "recorded": dict(recorded) if isinstance(recorded, Mapping) else None},
        golden_created_at=_str_or_none(golden.header.extra.get("created_at")),
        notes=tuple(notes),
        golden_machine=golden_machine,
        machine=machine,
    )
    return result, fresh


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping_or_none(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None
