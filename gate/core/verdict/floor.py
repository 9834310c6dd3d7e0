"""The honest floor a pin carries for the distribution verdict (`gate.core.verdict.distribution`).

How far an honest engine's distribution sits from the oracle's, where both saw the oracle's
context, measured once (by the doctrine study, or by `gate pin record` from the honest
re-runs it can make) and carried in the pin's doctrine (`oracle.json` and the pin trace
header's `doctrine.floor`):

    "floor": {"kl_mean_mnats": 0.6, "kl_p99_mnats": 9.0, "same_top_rate": 0.985,
              "margin": 3, "measured_by": "doctrine study ..."}

A run whose mean KL, p99 KL or same-top miss rate is beyond `margin` times the floor's is
not the reference model within honest noise. Pure: no imports from the rest of the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.errors import InputError

FLOOR_KEYS = ("kl_mean_mnats", "kl_p99_mnats", "same_top_rate", "margin", "measured_by")


@dataclass(frozen=True, slots=True)
class Floor:
    """The honest maxima of the distribution figures and the margin a run may exceed them by.

    kl_mean_mnats / kl_p99_mnats: the largest mean and 99th percentile of KL(oracle ||
        honest candidate) over the common top-k support (each side renormalised), in mnats;
    same_top_rate: the lowest rate of positions where an honest candidate's top token is
        the oracle's;
    margin: a run is beyond the floor when a figure passes margin x the floor's (for the
        same-top rate: its miss rate, 1 - rate, passes margin x the floor's miss rate);
    measured_by: how the floor was measured (which honest runs, on what machine).
    """

    kl_mean_mnats: float
    kl_p99_mnats: float
    same_top_rate: float
    margin: float
    measured_by: str

    def __post_init__(self) -> None:
        for name in ("kl_mean_mnats", "kl_p99_mnats", "same_top_rate", "margin"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"doctrine floor: {name} must be a finite number, found {value!r}")
        if self.kl_mean_mnats <= 0 or self.kl_p99_mnats <= 0:
            # A floor of 0 would fail every engine that is not the oracle bit for bit.
            raise InputError(
                "doctrine floor: kl_mean_mnats and kl_p99_mnats must be > 0 (honest engines differ), "
                f"found {self.kl_mean_mnats!r} and {self.kl_p99_mnats!r}"
            )
        if not 0.0 <= self.same_top_rate < 1.0:
            raise InputError(f"doctrine floor: same_top_rate must be in [0, 1), found {self.same_top_rate!r}")
        if self.margin < 1.0:
            raise InputError(f"doctrine floor: margin must be >= 1, found {self.margin!r}")
        if not isinstance(self.measured_by, str) or not self.measured_by.strip():
            raise InputError("doctrine floor: measured_by must say how the floor was measured")
        # The limits a run is judged by must be numbers too: a margin of 1e308 would make
        # every limit infinite, a floor nothing can be beyond.
        for name, value in (("kl_mean_mnats", self.kl_mean_limit), ("kl_p99_mnats", self.kl_p99_limit)):
            if not math.isfinite(value):
                raise InputError(
                    f"doctrine floor: {name} x margin ({getattr(self, name)!r} x {self.margin!r}) is not finite"
                )

    @property
    def kl_mean_limit(self) -> float:
        return self.kl_mean_mnats * self.margin

    @property
    def kl_p99_limit(self) -> float:
        return self.kl_p99_mnats * self.margin

    @property
    def same_top_miss_limit(self) -> float:
        """The largest miss rate (1 - same-top rate) a run may show."""
        return (1.0 - self.same_top_rate) * self.margin

    def to_dict(self) -> dict[str, Any]:
        return {
            "kl_mean_mnats": float(self.kl_mean_mnats),
            "kl_p99_mnats": float(self.kl_p99_mnats),
            "same_top_rate": float(self.same_top_rate),
            "margin": float(self.margin),
            "measured_by": self.measured_by,
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str = "doctrine", key: str = "floor") -> Floor:
        if not isinstance(raw, Mapping):
            raise InputError(f"{where}: field '{key}' must be an object, found {type(raw).__name__}")
        unknown = sorted(set(raw) - set(FLOOR_KEYS))
        missing = [k for k in FLOOR_KEYS if k not in raw]
        if unknown or missing:
            raise InputError(
                f"{where}: field '{key}': expected keys {', '.join(FLOOR_KEYS)}"
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        try:
            return cls(**{k: raw[k] for k in FLOOR_KEYS})
        except InputError as exc:
            raise InputError(f"{where}: field '{key}': {exc}") from None
