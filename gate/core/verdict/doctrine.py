"""The doctrine: what the gate ratifies besides a strict match."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
# The drift's tail limit (the run's p90 of |swing|) when the doctrine names none: this many
# times `drift_ulps`. Honest engines' p90 reach 1.03 units, the self-test's one-step mutant
# (which must be ratified) 2; the default drift_ulps 2 puts the tail limit at 4.
DRIFT_TAIL_FACTOR = 2.0
# The grid the ULP doctrine uses when neither the doctrine nor the oracle's header names one.
DEFAULT_DTYPE = "bfloat16"


@dataclass(frozen=True, slots=True)
class Evidence:
    """The evidence rule, in *noise units*: steps of the model dtype's grid at the oracle's
    top logit, or at the least logit (`floor_logit`) where the top logit is smaller. Below that size a logit's
    own rounding no longer limits its precision (the hidden states and weights that make it
    do: measured across ISA paths, honest flips at |logit| 4-8 reach 4.5 of its steps, 1.1
    units), so the unit does not shrink with it.

    A flip (candidate token c where the oracle took o, 0 < gap) is a near tie when
      - the oracle's gap u_o = (L[o] - L[c]) / step is at most `oracle_ulps`,
      - the candidate's own margin u_c = (C[c] - C[o]) / step, from its top-k at that
        position, is at most `candidate_ulps`, and
      - the run's drift (median |swing| of the top-1-minus-top-2 difference over every
        position where the candidate shares the oracle's context) is at most `drift_ulps`;
    else it is a defect. A flip without the candidate's top-k there (or one lacking either
    token) earns no allowance in grid steps (`near_tie_ulps` does not apply under this rule:
    a doctrine that asks for the candidate's lists is not passed by their absence); a run
    too short to measure its drift skips that test.
    """

    oracle_ulps: float
    candidate_ulps: float
    drift_ulps: float
    floor_logit: float = DEFAULT_FLOOR_LOGIT
    # The limit on the run's p90 of |swing| (the drift's tail); None: DRIFT_TAIL_FACTOR x
    # drift_ulps. `drift_ulps` bounds the median over the run, each prompt and each window
    # of positions (gate.core.verdict.evidence).
    drift_p90_ulps: float | None = None

    def __post_init__(self) -> None:
        for name in ("oracle_ulps", "candidate_ulps", "drift_ulps", "floor_logit", "drift_p90_ulps"):
            value = getattr(self, name)
            if name == "drift_p90_ulps" and value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or math.isnan(value)
                or math.isinf(value)
                or value < 0
            ):
                raise InputError(f"doctrine evidence: {name} must be a finite number >= 0, found {value!r}")

    def to_dict(self) -> dict[str, float]:
        out = {
            "oracle_ulps": float(self.oracle_ulps),
            "candidate_ulps": float(self.candidate_ulps),
            "drift_ulps": float(self.drift_ulps),
            "floor_logit": float(self.floor_logit),
        }
        if self.drift_p90_ulps is not None:
            out["drift_p90_ulps"] = float(self.drift_p90_ulps)
        return out

    @property
    def tail_limit_ulps(self) -> float:
        """The limit on the run's p90 of |swing|."""
        return float(self.drift_p90_ulps) if self.drift_p90_ulps is not None else DRIFT_TAIL_FACTOR * self.drift_ulps

    def unit_logit(self, top_logit: float) -> float:
        """The logit size whose grid step is this rule's unit at a position."""
        return max(abs(top_logit), self.floor_logit)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "doctrine") -> Evidence:
        if not isinstance(raw, Mapping):
            raise InputError(f"{where}: field 'evidence' must be an object, found {type(raw).__name__}")
        keys = ("oracle_ulps", "candidate_ulps", "drift_ulps")
        optional = ("floor_logit", "drift_p90_ulps")
        unknown = sorted(set(raw) - {*keys, *optional})
        missing = [k for k in keys if k not in raw]
        if unknown or missing:
            raise InputError(
                f"{where}: field 'evidence': expected keys {', '.join(keys)}"
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + (f"; missing {', '.join(missing)}" if missing else "")
            )
        try:
            return cls(**{k: raw[k] for k in (*keys, *optional) if k in raw})
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
    # The honest floor against the pin's float32 reference lists (gate.core.verdict.reference):
    # where the pin carries both, it decides the distribution verdict.
    reference_floor: Floor | None = None
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
        if self.reference_floor is not None:
            out["reference_floor"] = self.reference_floor.to_dict()
        return out


# --------------------------------------------------------------------------- a pin's own doctrine


def _number(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not 0 <= value < float("inf"):
        raise InputError(f"{what}: must be a number >= 0, found {value!r}")
    return float(value)


def _dtype_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{what}: must be a dtype name, found {value!r}")
    return value


def _evidence(value: Any, what: str) -> Evidence:
    # `Evidence.from_dict` names its own field: say where the doctrine object is.
    where = what.removesuffix(".evidence'") + "'" if what.endswith(".evidence'") else what
    return Evidence.from_dict(value, where)


def _floor(value: Any, what: str) -> Floor:
    where = what.removesuffix(".floor'") + "'" if what.endswith(".floor'") else what
    return Floor.from_dict(value, where)


def _reference_floor(value: Any, what: str) -> Floor:
    where = what.removesuffix(".reference_floor'") + "'" if what.endswith(".reference_floor'") else what
    return Floor.from_dict(value, where, key="reference_floor")


# A doctrine object's fields, as a pin carries it (oracle.json's `doctrine`, and the pin
# trace header's `doctrine`, which travels with the pin trace wherever it is judged): each
# key, the `Doctrine` attribute of the same name, and how its value is checked and read.
# A new doctrine field is one entry here and one attribute of `Doctrine`: the checking of
# pins, the resolver and its per-field overrides pick it up.
DOCTRINE_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "near_tie_mnats": _number,
    "near_tie_ulps": _number,
    "evidence": _evidence,
    "dtype": _dtype_name,
    "floor": _floor,
    "reference_floor": _reference_floor,
}
PIN_DOCTRINE_KEYS = tuple(DOCTRINE_FIELDS)


def _read_fields(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: field 'doctrine': must be an object, found {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        read = DOCTRINE_FIELDS.get(key)
        if read is None:
            raise InputError(f"{where}: field 'doctrine.{key}': unknown (known: {', '.join(PIN_DOCTRINE_KEYS)})")
        out[key] = read(value, f"{where}: field 'doctrine.{key}'")
    return out


def check_pin_doctrine(raw: Any, where: str) -> dict[str, Any]:
    """A pin's doctrine object, checked: numbers >= 0, an `evidence` object, a dtype name.
    Returns it as a plain dict; anything else is an InputError naming `where` and the key."""
    _read_fields(raw, where)
    return dict(raw)


# --------------------------------------------------------------------------- the one resolver

# A command line's changes to a doctrine, field by field: a key of `DOCTRINE_FIELDS`, or
# `evidence.<key>` for one field of the evidence rule, mapped to its new value; None drops
# the field (`{"evidence": None}`: judge without the evidence rule, `--no-evidence`).
Overrides = Mapping[str, Any]


def override_flag(key: str, value: Any) -> str:
    """How the command line says one override: `--near-tie-mnats 125`, `--no-evidence`."""
    flag = "--" + key.replace(".", "-").replace("_", "-")
    if value is None:
        return "--no-" + flag[2:]
    return f"{flag} {value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else f"{flag} {value}"


def apply_overrides(own: Mapping[str, Any], overrides: Overrides) -> dict[str, Any]:
    """`own` (a doctrine object) with each override applied to its own field only."""
    merged: dict[str, Any] = dict(own)
    for key, value in overrides.items():
        head, _, sub = key.partition(".")
        if head not in DOCTRINE_FIELDS:
            raise InputError(
                f"{override_flag(key, value)}: not a doctrine field (known: {', '.join(PIN_DOCTRINE_KEYS)})"
            )
        if not sub:
            if value is None:
                merged.pop(head, None)
            else:
                merged[head] = value
                DOCTRINE_FIELDS[head](value, override_flag(key, value).split(" ")[0])
            continue
        base = merged.get(head)
        if not isinstance(base, Mapping):
            raise InputError(f"{override_flag(key, value)}: the doctrine has no '{head}' rule to change")
        merged[head] = {**base, sub: value}
        DOCTRINE_FIELDS[head](merged[head], override_flag(key, value).split(" ")[0])
    return merged


def resolve_doctrine(
    own: Mapping[str, Any] | None,
    overrides: Overrides | None = None,
    *,
    strict: bool = False,
    defaults: Mapping[str, Any] | None = None,
    source: str = "",
) -> Doctrine:
    """The doctrine a judgement applies, decided here for every command: the pin's own
    doctrine `own` (else `defaults`, else the `Doctrine` defaults), with each override
    changing its own field and nothing else: `--near-tie-mnats 125` keeps the pin's
    evidence rule; only `{"evidence": None}` (`--no-evidence`) drops it.

    `source` says where `own` came from ("the pin's (<path>)"); the doctrine's `source`
    adds the flags that changed it."""
    base = dict(own) if own else dict(defaults or {})
    where = source or ("the default doctrine" if not own else "doctrine")
    _read_fields(base, where)
    changes = dict(overrides or {})
    merged = apply_overrides(base, changes)
    fields = _read_fields(merged, where)
    said = source if own else ""
    if changes:
        flags = ", ".join(override_flag(k, v) for k, v in changes.items())
        said = f"{said}; changed on the command line: {flags}" if said else f"command line: {flags}"
    return Doctrine(strict=strict, source=said, **fields)


def header_doctrine(extra: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The doctrine an oracle trace's header carries (`doctrine`, an addition to trace v1),
    checked; None when it carries none."""
    raw = extra.get("doctrine")
    return None if raw is None else check_pin_doctrine(raw, where)
