"""The doctrine: what the gate ratifies besides a strict match."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gate.errors import InputError

# One bf16 step at |logit| 16-32 is 2**-3 = 125 mnats: the coarsest grid step at the logit
# sizes where a model's top candidates sit. Two honest engines running the same bf16
# weights drift by about this much (HF vs vLLM on SmolLM2-135M: median 20, max 189 mnats on
# the same token), so a gap of at most one such step is a near tie, not a defect.
DEFAULT_NEAR_TIE_MNATS = 125.0
# The grid the ULP doctrine uses when neither the doctrine nor the oracle's header names one.
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True, slots=True)
class Doctrine:
    """How divergences are judged.

    near_tie_mnats: a gap of more than 0 and at most this many millinats is a near tie.
    near_tie_ulps: when set, a gap of at most this many steps of `dtype`'s grid at the size
        of the oracle's top logit is also a near tie (needs the pin's raw logits).
    dtype: the grid's dtype; None takes the oracle header's `dtype` (else bfloat16) when
        `compare` runs.
    strict: a ratified-only pass fails (exit 1).
    """

    near_tie_mnats: float = DEFAULT_NEAR_TIE_MNATS
    strict: bool = False
    near_tie_ulps: float | None = None
    dtype: str | None = None

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
            out["dtype"] = self.dtype or DEFAULT_DTYPE
        return out
