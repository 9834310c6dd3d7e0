"""The doctrine: what the gate ratifies besides a strict match."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gate.core.verdict.floor import Floor
from gate.errors import InputError

# One bf16 step at |logit| 16-32 is 2**-3 = 125 mnats: the coarsest grid step at the logit
# sizes where a model's top candidates sit. Two honest engines running the same bf16
# weights drift by about this much (HF vs vLLM on SmolLM2-135M: median 20, max 189 mnats on
# the same token), so a gap of at most one such step is a near tie, not a defect.
DEFAULT_NEAR_TIE_MNATS = 125.0
# The evidence rule's unit never shrinks below the grid step at this logit size (bf16: 125
# mnats): the size where a model's top candidates usually sit (see `Evidence`).
DEFAULT_FLOOR_LOGIT = 16.0
# The grid the ULP doctrine uses when neither the doctrine nor the oracle's header names one.
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True, slots=True)
class Evidence:
    """The evidence rule, in *noise units*: steps of the model dtype's grid at the oracle's
    top logit, or at `floor_logit` where the top logit is smaller. Below that size a logit's
    own rounding no longer limits its precision (the hidden states and weights that make it
    do: measured across ISA paths, honest flips at |logit| 4-8 reach 4.5 of its steps, 1.1
    units), so the unit does not shrink with it.

    A flip (candidate token c where the oracle took o, 0 < gap) is a near tie when
      - the oracle's gap u_o = (L[o] - L[c]) / step is at most `oracle_ulps`,
      - the candidate's own margin u_c = (C[c] - C[o]) / step, from its top-k at that
        position, is at most `candidate_ulps`, and
      - the run's drift (median |swing| of the top-1-minus-top-2 difference over every
        position where the candidate shares the oracle's context) is at most `drift_ulps`;
    else it is a defect. A flip without the candidate's top-k there falls back to the
    doctrine's `near_tie_ulps`; a run too short to measure its drift skips that test.
    """

    oracle_ulps: float
    candidate_ulps: float
    drift_ulps: float
    floor_logit: float = DEFAULT_FLOOR_LOGIT

    def __post_init__(self) -> None:
        for name in ("oracle_ulps", "candidate_ulps", "drift_ulps", "floor_logit"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or math.isnan(value)
                or math.isinf(value)
                or value < 0
            ):
                raise InputError(f"doctrine evidence: {name} must be a finite number >= 0, found {value!r}")

    def to_dict(self) -> dict[str, float]:
        return {
            "oracle_ulps": float(self.oracle_ulps),
            "candidate_ulps": float(self.candidate_ulps),
            "drift_ulps": float(self.drift_ulps),
            "floor_logit": float(self.floor_logit),
        }

    def unit_logit(self, top_logit: float) -> float:
        """The logit size whose grid step is this rule's unit at a position."""
        return max(abs(top_logit), self.floor_logit)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "doctrine") -> Evidence:
        if not isinstance(raw, Mapping):
            raise InputError(f"{where}: field 'evidence' must be an object, found {type(raw).__name__}")
        keys = ("oracle_ulps", "candidate_ulps", "drift_ulps")
        unknown = sorted(set(raw) - {*keys, "floor_logit"})
        missing = [k for k in keys if k not in raw]
        if unknown or missing:
            raise InputError(
                f"{where}: field 'evidence': expected keys {', '.join(keys)}"
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        try:
            return cls(**{k: raw[k] for k in (*keys, "floor_logit") if k in raw})
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Doctrine:
    """How divergences are judged.

    near_tie_mnats: a gap of more than 0 and at most this many millinats is a near tie.
    near_tie_ulps: when set, a gap of at most this many steps of `dtype`'s grid at the size
        of the oracle's top logit is also a near tie (needs the pin's raw logits).
    dtype: the grid's dtype; None takes the oracle header's `dtype` (else bfloat16) when
        `compare` runs.
    strict: a ratified-only pass fails (exit 1).
    evidence: when set, a flip where the candidate's own top-k is known is judged by the
        evidence rule (`gate.core.verdict.evidence`, `Evidence`) instead of `near_tie_ulps`.
    """

    near_tie_mnats: float = DEFAULT_NEAR_TIE_MNATS
    strict: bool = False
    near_tie_ulps: float | None = None
    dtype: str | None = None
    evidence: Evidence | None = None
    # The pin's honest floor for the distribution verdict (gate.core.verdict.distribution).
    floor: Floor | None = None
    # Where this doctrine came from, for reports ("pin <path>", "command line", "default").
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.near_tie_mnats, (int, float)) or math.isnan(self.near_tie_mnats):
            raise InputError(f"--near-tie-mnats must be a number, found {self.near_tie_mnats!r}")
        if self.near_tie_mnats < 0 or math.isinf(self.near_tie_mnats):
            raise InputError(f"--near-tie-mnats must be finite and >= 0, found {self.near_tie_mnats!r}")
        if self.near_tie_ulps is not None and (
            math.isnan(self.near_tie_ulps) or self.near_tie_ulps < 0 or math.isinf(self.near_tie_ulps)
        ):
            raise InputError(f"--near-tie-ulps must be finite and >= 0, found {self.near_tie_ulps!r}")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"near_tie_mnats": float(self.near_tie_mnats), "strict": self.strict}
        if self.near_tie_ulps is not None:
            out["near_tie_ulps"] = float(self.near_tie_ulps)
        if self.evidence is not None:
            out["evidence"] = self.evidence.to_dict()
        if self.near_tie_ulps is not None or self.evidence is not None:
            out["dtype"] = self.dtype or DEFAULT_DTYPE
        if self.floor is not None:
            out["floor"] = self.floor.to_dict()
        return out


# --------------------------------------------------------------------------- a pin's own doctrine

# The keys of a doctrine object as a pin carries it (oracle.json's `doctrine`, and the pin
# trace header's `doctrine`, which travels with the pin trace wherever it is judged).
PIN_DOCTRINE_KEYS = ("near_tie_mnats", "near_tie_ulps", "evidence", "dtype", "floor")


def check_pin_doctrine(raw: Any, where: str) -> dict[str, Any]:
    """A pin's doctrine object, checked: numbers >= 0, an `evidence` object, a dtype name.
    Returns it as a plain dict; anything else is an InputError naming `where` and the key."""
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: field 'doctrine': must be an object, found {raw!r}")
    for key, v in raw.items():
        if key not in PIN_DOCTRINE_KEYS:
            raise InputError(f"{where}: field 'doctrine.{key}': unknown (known: {', '.join(PIN_DOCTRINE_KEYS)})")
        if key == "evidence":
            Evidence.from_dict(v, f"{where}: field 'doctrine'")
        elif key == "floor":
            Floor.from_dict(v, f"{where}: field 'doctrine'")
        elif key == "dtype":
            if not isinstance(v, str) or not v:
                raise InputError(f"{where}: field 'doctrine.dtype': must be a dtype name, found {v!r}")
        elif type(v) not in (int, float) or not 0 <= v < float("inf"):
            raise InputError(f"{where}: field 'doctrine.{key}': must be a number >= 0, found {v!r}")
    return dict(raw)


def resolve_doctrine(
    own: Mapping[str, Any] | None,
    *,
    strict: bool = False,
    near_tie_mnats: float | None = None,
    near_tie_ulps: float | None = None,
    source: str = "",
) -> Doctrine:
    """The doctrine a judgement applies: the command line's thresholds when given (the
    classic rule: fixed mnats, grid steps, no evidence), else the pin's own `own`, else the
    defaults. `source` says where the pin's came from (for the report)."""
    if near_tie_mnats is not None or near_tie_ulps is not None:
        return Doctrine(
            near_tie_mnats=DEFAULT_NEAR_TIE_MNATS if near_tie_mnats is None else float(near_tie_mnats),
            strict=strict,
            near_tie_ulps=None if near_tie_ulps is None else float(near_tie_ulps),
            # The thresholds are the person's; the floor is the pin's measured noise, and stays.
            floor=pin_floor(own, source),
            source="command line",
        )
    if not own:
        return Doctrine(strict=strict)
    ev = own.get("evidence")
    ulps = own.get("near_tie_ulps")
    dtype = own.get("dtype")
    return Doctrine(
        near_tie_mnats=float(own.get("near_tie_mnats", DEFAULT_NEAR_TIE_MNATS)),
        strict=strict,
        near_tie_ulps=None if ulps is None else float(ulps),
        dtype=dtype if isinstance(dtype, str) else None,
        evidence=Evidence.from_dict(ev, source or "doctrine") if ev is not None else None,
        floor=pin_floor(own, source),
        source=source or "pin",
    )


def pin_floor(own: Mapping[str, Any] | None, source: str = "") -> Floor | None:
    """The honest floor a pin's doctrine carries (`floor`), or None."""
    raw = own.get("floor") if own else None
    return Floor.from_dict(raw, source or "doctrine") if raw is not None else None


def header_doctrine(extra: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The doctrine an oracle trace's header carries (`doctrine`, an addition to trace v1),
    checked; None when it carries none."""
    raw = extra.get("doctrine")
    return None if raw is None else check_pin_doctrine(raw, where)
