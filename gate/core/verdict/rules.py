"""The names of the rules that decide a divergence (`Divergence.rule`, the JSON report's `rule`):
for a tie, the rule that ratified it; for a defect, the limit it failed (pure constants). The
order in which they are tried, and what each one weighs, is `gate.core.verdict.chain.CHAIN`."""

from __future__ import annotations

RULE_EXACT_TIE = "exact_tie"  # bit-identical logprobs: a tie-break convention
RULE_MNATS = "near_tie_mnats"  # 0 < gap <= the doctrine's near_tie_mnats
RULE_GRID = "near_tie_grid_steps"  # gap <= near_tie_ulps of the logit's own grid (no evidence weighed)
RULE_EVIDENCE = "near_tie_evidence"  # oracle gap and own margin within the evidence rule's units
RULE_RAN_OUT = "ran_out"  # the candidate stopped before the oracle's continuation ended
RULE_NOT_IN_TOP_K = "not_in_top_k"  # the candidate's token is not in the oracle's list
RULE_NOT_GREEDY = "not_greedy"  # not greedy over its own logprobs where it shares the oracle's context
RULE_BEYOND_MNATS = "beyond_mnats"  # the gap is beyond near_tie_mnats and no other rule applies
RULE_BEYOND_GRID = "beyond_grid_steps"  # the gap is beyond near_tie_mnats and near_tie_ulps
RULE_ORACLE_GAP = "oracle_gap_beyond"  # evidence: the oracle's gap beyond oracle_ulps units
RULE_OWN_MARGIN = "own_margin_beyond"  # evidence: the candidate's own margin beyond candidate_ulps units
RULE_NEGATIVE_MARGIN = "negative_margin"  # evidence: its own list ranks the oracle's token above its own
RULE_DRIFT_BEYOND = "drift_beyond"  # the run drifts beyond the doctrine: no allowance beyond the mnats
RULE_NO_LIST = "no_list"  # no usable own list at this flip, under the evidence rule
RULES = (
    RULE_EXACT_TIE,
    RULE_MNATS,
    RULE_GRID,
    RULE_EVIDENCE,
    RULE_RAN_OUT,
    RULE_NOT_IN_TOP_K,
    RULE_NOT_GREEDY,
    RULE_BEYOND_MNATS,
    RULE_BEYOND_GRID,
    RULE_ORACLE_GAP,
    RULE_OWN_MARGIN,
    RULE_NEGATIVE_MARGIN,
    RULE_DRIFT_BEYOND,
    RULE_NO_LIST,
)
