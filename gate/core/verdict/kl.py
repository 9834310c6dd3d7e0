"""The KL of the distribution verdict (`gate.core.verdict.distribution`): KL(reference ||
candidate) over the reference's top-k list, the candidate's absent tokens charged at the
most its list allows (`kl_mnats`), and over the common support (`kl_common_mnats`).

Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gate.core.verdict.evidence import lp_map

__all__ = ["canonical", "kl_common_mnats", "kl_mnats"]


def kl_common_mnats(oracle_top: Sequence[Sequence[Any]], candidate_top: Sequence[Sequence[Any]]) -> tuple[float, int]:
    """KL(oracle || candidate) over the tokens both lists carry, each side renormalised over
    them, in mnats; with the support's size (0: nothing in common, KL 0)."""
    o, c = lp_map(oracle_top), lp_map(candidate_top)
    common = [t for t in o if t in c]
    if not common:
        return 0.0, 0
    on = _normalised({t: o[t] for t in common})
    cn = _normalised({t: c[t] for t in common})
    kl = math.fsum(math.exp(on[t]) * (on[t] - cn[t]) for t in common)
    return 1000.0 * max(kl, 0.0), len(common)


def _normalised(values: Mapping[int, float]) -> dict[int, float]:
    """Each logprob less the values' log-sum-exp, taken relative to their maximum: at a huge
    magnitude (-3.4e38, a masked logit) `m + log(k)` rounds to m, and every token would read
    as probability 1."""
    m = max(values.values())
    log_mass = math.log(math.fsum(math.exp(v - m) for v in values.values()))
    return {t: (v - m) - log_mass for t, v in values.items()}


def canonical(top: Sequence[Sequence[Any]], keep: int) -> dict[int, float]:
    """The list's first `keep` entries in the spec's order (logprob descending, then id):
    what it says its top `keep` are. Entries past them are not measured, so dropping them
    changes nothing."""
    pairs = sorted(((int(t), float(lp)) for t, lp in top), key=lambda p: (-p[1], p[0]))
    return dict(pairs[:keep])


def kl_mnats(oracle_top: Sequence[Sequence[Any]], cand: Mapping[int, float]) -> tuple[float, int]:
    """KL(oracle || candidate) over the oracle's list, both sides renormalised over it, in
    mnats, with the size of the common support.

    An oracle token the candidate's list `cand` (its top entries, `canonical`) lacks has at
    most the list's smallest logprob b (the list is its top k); and it may be a token the
    candidate moved into the slot of one the oracle does not list. So each such token is
    charged at b or at the largest logprob the list gives a token the oracle does not list,
    whichever makes the KL larger: replacing a listed oracle token by an unlisted one at the
    same logprob can then only raise the KL (the configuration before is one of those
    charged after). The KL is quasi-convex in each charged value, so its maximum over those
    choices is at their ends, and for k tokens at the top end at the k the oracle gives the
    least mass: k = 0 .. |absent| covers it. An empty `cand` is not measured (0, 0)."""
    if not cand:
        return 0.0, 0
    o = _normalised(lp_map(oracle_top))
    share = {t: math.exp(lp) for t, lp in o.items()}
    bound = min(cand.values())
    top = max((lp for t, lp in cand.items() if t not in o), default=bound)
    absent = sorted((t for t in o if t not in cand), key=lambda t: (share[t], t))
    best = -math.inf
    for k in range(len(absent) + 1 if top > bound else 1):
        high = set(absent[:k])
        q = _normalised({t: cand.get(t, top if t in high else bound) for t in o})
        kl = math.fsum(share[t] * (o[t] - q[t]) for t in o)
        best = max(best, kl)
    return 1000.0 * max(best, 0.0), len(o) - len(absent)
