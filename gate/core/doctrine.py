"""The doctrine: what the gate ratifies besides a strict match."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.errors import InputError

# One bf16 step at |logit| 16-32 is 2**-3 = 125 mnats: the coarsest grid step at the logit
# sizes where a model's top candidates sit. Two honest engines running the same bf16
# weights drift by about this much (HF vs vLLM on SmolLM2-135M: median 20, max 189 mnats on
# the same token), so a gap of at most one such step is a near tie, not a defect.
DEFAULT_NEAR_TIE_MNATS = 125.0
# The grid the ULP doctrine uses when neither the doctrine nor the oracle's header names one.
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True, slots=True)
class Evidence:
    """The evidence rule, in grid steps of the model dtype at the oracle's top logit.

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

    def __post_init__(self) -> None:
        for name in ("oracle_ulps", "candidate_ulps", "drift_ulps"):
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
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "doctrine") -> Evidence:
        if not isinstance(raw, Mapping):
            raise InputError(f"{where}: field 'evidence' must be an object, found {type(raw).__name__}")
        keys = ("oracle_ulps", "candidate_ulps", "drift_ulps")
        unknown = sorted(set(raw) - set(keys))
        missing = [k for k in keys if k not in raw]
        if unknown or missing:
            raise InputError(
                f"{where}: field 'evidence': expected keys {', '.join(keys)}"
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        try:
            return cls(**{k: raw[k] for k in keys})
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
        evidence rule (`gate.core.evidence`, `Evidence`) instead of `near_tie_ulps`.
    """

    near_tie_mnats: float = DEFAULT_NEAR_TIE_MNATS
    strict: bool = False
    near_tie_ulps: float | None = None
    dtype: str | None = None
    evidence: Evidence | None = None

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
        return out
