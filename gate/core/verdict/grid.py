"""The grid of a floating-point dtype: how far apart two representable logits are.

Pure arithmetic (no torch): the units of the rules in `gate.core.verdict.chain`.
"""

from __future__ import annotations

import math

from gate.errors import InputError

# dtype -> (stored mantissa bits, exponent of the smallest normal number).
_GRIDS: dict[str, tuple[int, int]] = {
    "bfloat16": (7, -126),
    "bf16": (7, -126),
    "float16": (10, -14),
    "fp16": (10, -14),
    "half": (10, -14),
    "float32": (23, -126),
    "fp32": (23, -126),
    "float": (23, -126),
}


# The widest grid step the ULP doctrine takes: that of |logit| in [64, 128) (bf16 0.5 nats,
# fp16 2**-4, fp32 2**-17). Logits are shift-invariant, so nothing in the logprobs can prove
# a recorded logit false; this cap bounds what a tampered (or unusual) one can ratify. A
# model whose top logit really is >= 128 gets a step under-estimated: stricter, never laxer.
MAX_GRID_LOGIT = 128.0
_MAX_GRID_EXP = 6  # frexp exponent - 1 of the binade [64, 128)


def grid_step(value: float, dtype: str = "bfloat16") -> float:
    """One step (ULP) of `dtype`'s grid at |value|, in nats.

    bf16 keeps 8 significant bits: at |logit| in [16, 32) a step is 2**-3 = 0.125 nats, and
    a power of two belongs to the binade above it (16.0 has the step of [16, 32)). Below the
    smallest normal number (and for a value that is not finite) the step stays that of the
    subnormals; at |value| >= MAX_GRID_LOGIT it is that of [64, 128).
    """
    grid = _GRIDS.get(dtype.removeprefix("torch."))
    if grid is None:
        raise InputError(f"unknown dtype {dtype!r} for the ULP doctrine (bfloat16, float16, float32)")
    bits, emin = grid
    mag = abs(value)
    if mag == 0.0 or not math.isfinite(mag):
        return 2.0 ** (emin - bits)
    if mag >= MAX_GRID_LOGIT:
        return 2.0 ** (_MAX_GRID_EXP - bits)
    _, exp = math.frexp(mag)  # mag = m * 2**exp with m in [0.5, 1)
    return 2.0 ** (max(exp - 1, emin) - bits)


def logprob_slack(*logprobs: float) -> float:
    """How far float32 rounding can move a difference of these logprobs, in nats.

    Engines compute logprobs in float32 as `logit - logsumexp`: the logsumexp is shared and
    cancels in a gap, but each logprob is rounded once, by up to half a float32 step at its
    size. A gap of exactly N grid steps between two logits can therefore read as N steps
    plus or minus one float32 step; the ULP doctrine allows that much and no more.
    """
    return grid_step(max(abs(lp) for lp in logprobs), "float32")
