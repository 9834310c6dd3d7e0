"""Checks of an oracle and a candidate trace taken together, before adjudication: what
makes a comparison meaningless (nothing to compare, two tokenizers) is an input error;
what merely differs (the model names) is a warning for the report."""

from __future__ import annotations

from gate.core.traces.trace import Trace
from gate.errors import InputError


def _tokenizer_hash(trace: Trace) -> str | None:
    for source in (trace.header.extra, trace.header.engine):
        value = source.get("tokenizer_sha256")
        if isinstance(value, str) and value:
            return value
    return None


def header_warnings(oracle: Trace, candidate: Trace) -> tuple[str, ...]:
    """Refuse headers whose tokens cannot be one model's; warn where they merely differ."""
    o_tok, c_tok = _tokenizer_hash(oracle), _tokenizer_hash(candidate)
    if o_tok is not None and c_tok is not None and o_tok != c_tok:
        raise InputError(
            f"{candidate.path}: header field 'tokenizer_sha256' is {c_tok[:12]}..., the oracle {oracle.path} has "
            f"{o_tok[:12]}...: different tokenizers, so the token ids cannot be compared"
        )
    out: list[str] = []
    if oracle.header.model != candidate.header.model:
        out.append(
            f"the headers name different models: oracle {oracle.header.model!r}, candidate "
            f"{candidate.header.model!r} (fine for a quantised or renamed copy; wrong otherwise)"
        )
    out.extend(other_model_warnings(candidate))
    return tuple(out)


def _names(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list | tuple) else []


def _few_names(names: list[str], shown: int = 5) -> str:
    """At most `shown` names, each cut to 80 characters and quoted (a server's text)."""
    head = ", ".join(repr(n[:80]) for n in names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")


def other_model_warnings(candidate: Trace) -> list[str]:
    """Where the candidate's server answered as, or lists only, another model than the one
    it was asked for (its header's `engine.served_model`, `answered_models`, `server_models`):
    a warning every report shows beside the verdict, read from the trace, so a trace judged
    again by `gate compare` says it too."""
    engine = candidate.header.engine
    asked = engine.get("served_model")
    if not isinstance(asked, str) or not asked:
        return []
    out = []
    answered = sorted(set(_names(engine.get("answered_models"))) - {asked})
    if answered:
        out.append(
            f"the candidate's server answered as model {_few_names(answered)}, not {asked!r} as asked: "
            "the tokens judged may be another model's"
        )
    listed = _names(engine.get("server_models"))
    if listed and asked not in listed:
        out.append(f"the candidate's server lists model(s) {_few_names(sorted(listed))} and not {asked!r}")
    return out


def check_something_to_compare(oracle: Trace, candidate: Trace) -> None:
    """A run with no oracle position is no evidence of anything: an input error, never a pass."""
    if not oracle.records:
        raise InputError(f"{oracle.path}: no prompts (a header only): nothing to compare with {candidate.path}")
    if not any(r.token_ids for r in oracle.records):
        raise InputError(
            f"{oracle.path}: every continuation is empty ({len(oracle.records)} prompt(s), 0 positions): "
            "nothing to compare"
        )
