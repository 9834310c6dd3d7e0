"""MoE routing in traces and its attribution: the reader's checks, the first routing flip and
its class, the replay summary, and what the reports say. Pure: no torch, no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import EXACT_TIE, FORCED, FREE_RUN
from gate.core.verdict.routing import attribute_routing, oracle_routing
from gate.errors import InputError, TraceError
from gate.reports.json_report import render_json
from gate.reports.markdown import render_markdown
from gate.reports.terminal import render_text

MOE = {"layers": [0, 3], "top_k": 2, "num_experts": 8, "source": "vllm_router_capture"}
PROMPT = [10, 11, 12]
TOKENS = [5, 6, 7]
# One routing entry per input token: 3 prompt + 3 generated - 1 = 5, each [layer][k].
ROUTING = [[[0, 1], [2, 3]], [[1, 0], [4, 5]], [[0, 1], [2, 3]], [[6, 7], [1, 2]], [[0, 1], [3, 4]]]
TOP = [[[5, -0.1], [6, -0.5], [7, -0.6]], [[6, -0.2], [9, -0.2], [5, -1.0]], [[7, -0.3], [1, -1.5]]]


def oracle_lines(**record: Any) -> list[dict[str, Any]]:
    header = {
        "gate_trace": 1,
        "role": "oracle",
        "model": "org/moe",
        "top_k": 3,
        "engine": {"name": "vllm", "version": "0.32"},
        "moe": MOE,
    }
    rec = {
        "id": "p",
        "prompt_token_ids": PROMPT,
        "token_ids": TOKENS,
        "top_logprobs": TOP,
        "routed_experts": ROUTING,
        **record,
    }
    return [header, rec]


def candidate_lines(tokens: list[int], routing: list[Any], scores: list[Any], **record: Any) -> list[dict[str, Any]]:
    header = {
        "gate_trace": 1,
        "role": "candidate",
        "model": "org/moe",
        "top_k": 0,
        "engine": {"name": "hf", "version": "5.19"},
        "moe": {**MOE, "source": "hf_router_hooks"},
    }
    rec = {
        "id": "p",
        "prompt_token_ids": PROMPT,
        "token_ids": tokens,
        "routed_experts": routing,
        "router_top": scores,
        **record,
    }
    return [header, rec]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def scores_for(routing: list[Any], *, equal: tuple[int, int, int, int] | None = None, gap: float = 0.5) -> list[Any]:
    """Router top lists (4 experts) where each entry's chosen experts score highest; with
    `equal=(token, layer, a, b)`, experts a and b score the same there."""
    out = []
    for t, entry in enumerate(routing):
        layers = []
        for j, chosen in enumerate(entry):
            pairs = {e: -1.0 - 0.01 * i for i, e in enumerate(chosen)}
            for e in range(8):
                if e not in pairs and len(pairs) < 4:
                    pairs[e] = -1.0 - gap - 0.01 * e
            if equal is not None and (t, j) == equal[:2]:
                pairs[equal[2]] = pairs[equal[3]] = -1.5
            ordered = sorted(pairs.items(), key=lambda p: (-p[1], p[0]))[:4]
            layers.append([[e, s] for e, s in ordered])
        out.append(layers)
    return out


def run(tmp_path: Path, cand_tokens: list[int], cand_routing: list[Any], scores: list[Any], **record: Any) -> Any:
    o = read_trace(write(tmp_path / "o.jsonl", oracle_lines()))
    c = read_trace(write(tmp_path / "c.jsonl", candidate_lines(cand_tokens, cand_routing, scores, **record)))
    return attribute_routing(compare(o, c, Doctrine()), o, c)


def swapped(token: int, layer: int, old: int, new: int) -> list[Any]:
    rows = [[list(x) for x in entry] for entry in ROUTING]
    rows[token][layer] = [new if e == old else e for e in rows[token][layer]]
    return rows


# --------------------------------------------------------------------------- attribution


def test_an_exact_router_tie_is_attributed_to_the_router(tmp_path: Path) -> None:
    # Token 1 (inside the prompt), layer index 1 (model layer 3): the oracle took 5, the
    # candidate 6, and the candidate's router scored them the same.
    rows = swapped(1, 1, 5, 6)
    result = run(tmp_path, [5, 9, 1], rows, scores_for(rows, equal=(1, 1, 5, 6)))
    (d,) = result.divergences
    flip = d.routing_flip
    assert (d.source, d.position) == (FREE_RUN, 1)
    assert flip is not None
    assert (flip.layer, flip.token_index, flip.position) == (3, 1, None)
    assert (flip.oracle_expert, flip.candidate_expert) == (5, 6)
    assert flip.router_gap_mnats == 0.0 and flip.cls == EXACT_TIE and flip.tie_break == "higher_id"
    assert result.routing is not None and result.routing.routing_caused == 1 and result.routing.exact_ties == 1


def test_the_earliest_flip_wins_and_a_later_one_is_not_before_the_divergence(tmp_path: Path) -> None:
    # Flips at token 3 layer 0 and at token 4: the divergence at position 1 (produced by
    # token 3's step) sees only the first.
    rows = swapped(4, 0, 0, 5)
    rows[3][0] = [6, 2]
    result = run(tmp_path, [5, 9, 1], rows, scores_for(rows))
    flip = result.divergences[0].routing_flip
    assert flip is not None and (flip.layer, flip.token_index, flip.position) == (0, 3, 1)
    assert (flip.oracle_expert, flip.candidate_expert) == (7, 2)
    # 7 is not among the candidate's 4 recorded scores (0..5 fill the rest): only a bound.
    assert flip.router_gap_mnats is None and flip.gap_lower_bound_mnats is not None and flip.cls == "defect"


def test_a_flip_after_the_divergence_is_not_its_cause(tmp_path: Path) -> None:
    rows = swapped(4, 1, 3, 7)  # token 4 produces position 2; the divergence is at 1
    result = run(tmp_path, [5, 9, 1], rows, scores_for(rows))
    assert result.divergences[0].routing_flip is None
    assert result.routing is not None and result.routing.routing_caused == 0


@pytest.mark.parametrize(("gap", "cls"), [(0.05, "near_tie"), (0.5, "defect")])
def test_the_router_gap_classifies_the_flip(tmp_path: Path, gap: float, cls: str) -> None:
    rows = swapped(2, 0, 1, 4)
    scores = scores_for(rows)
    scores[2][0] = [[0, -1.0], [4, -1.0 - 0.01], [1, -1.0 - 0.01 - gap], [2, -3.0]]
    result = run(tmp_path, [5, 9, 1], rows, scores)
    flip = result.divergences[0].routing_flip
    assert flip is not None and flip.cls == cls
    assert flip.router_gap_mnats == pytest.approx(1000 * gap)


def test_forced_divergences_use_the_forced_routing(tmp_path: Path) -> None:
    forced_rows = swapped(3, 1, 1, 0)
    forced_scores = scores_for(forced_rows, equal=(3, 1, 0, 1))
    free_rows = ROUTING[:4]  # a free run that stopped after 2 tokens: 3 + 2 - 1 entries
    result = run(
        tmp_path,
        [5, 6],
        free_rows,
        scores_for(free_rows),
        forced_token_ids=[5, 8, 7],
        forced_routed_experts=forced_rows,
        forced_router_top=forced_scores,
    )
    by_source = {d.source: d for d in result.divergences}
    assert by_source[FREE_RUN].routing_flip is None  # ran out at 2: no routing differs
    forced = by_source[FORCED].routing_flip
    assert forced is not None and (forced.layer, forced.token_index, forced.cls) == (3, 3, EXACT_TIE)
    assert forced.tie_break == "lower_id"


def test_replayed_run_counts_what_remains_and_where_its_own_router_disagrees(tmp_path: Path) -> None:
    own = swapped(0, 0, 1, 2)  # what the candidate's scores rank first at token 0
    o = read_trace(write(tmp_path / "o.jsonl", oracle_lines()))
    lines = candidate_lines([5, 9, 1], ROUTING, scores_for(own))
    lines[0]["moe"]["routing"] = "oracle"
    c = read_trace(write(tmp_path / "c.jsonl", lines))
    result = attribute_routing(compare(o, c), o, c)
    summary = result.routing
    assert summary is not None and summary.replayed and summary.routing_caused == 0
    assert summary.router_disagreements == 1
    assert "replayed from the oracle; 1 divergence remains" in render_text(result)
    assert oracle_routing(o)[tuple(PROMPT)] == ROUTING


def test_dense_traces_are_untouched(tmp_path: Path) -> None:
    lines = oracle_lines()
    del lines[0]["moe"], lines[1]["routed_experts"]
    o = read_trace(write(tmp_path / "o.jsonl", lines))
    result = compare(
        o, o.__class__(o.header.__class__("candidate", "org/moe", 3, {"name": "x", "version": "1"}), o.records)
    )
    assert attribute_routing(result, o, o) is result
    assert "routing" not in orjson.loads(render_json(result))


def test_mismatched_layers_are_an_input_error(tmp_path: Path) -> None:
    o = read_trace(write(tmp_path / "o.jsonl", oracle_lines()))
    lines = candidate_lines(TOKENS, ROUTING, scores_for(ROUTING))
    lines[0]["moe"]["layers"] = [0, 2]
    c = read_trace(write(tmp_path / "c.jsonl", lines))
    with pytest.raises(InputError, match=r"MoE layers \[0, 2\]"):
        attribute_routing(compare(o, c), o, c)


# --------------------------------------------------------------------------- reports


def test_every_report_says_where_the_router_flipped(tmp_path: Path) -> None:
    rows = swapped(1, 1, 5, 6)
    result = run(tmp_path, [5, 9, 1], rows, scores_for(rows, equal=(1, 1, 5, 6)))
    line = "routing flip at layer 3, token 1 (prompt): expert 5 vs 6, router gap 0.0 mnats (exact tie, higher_id)"
    assert line in " ".join(render_text(result, width=200).split())
    assert line.replace("_", "\\_") in render_markdown(result)
    assert "1 of 1 divergence follow a routing flip (1 exact tie in the router)" in render_markdown(result)
    data = orjson.loads(render_json(result))
    assert data["routing"]["routing_caused"] == 1
    flip = data["divergences"][0]["routing_flip"]
    assert (flip["layer"], flip["oracle_expert"], flip["candidate_expert"], flip["class"]) == (3, 5, 6, "exact_tie")
    assert set(data["counts"]) == {
        "prompts",
        "strict_pass",
        "ratified_pass",
        "positions",
        "positions_matched",
        "unadjudicated_positions",
        "exact_ties",
        "near_ties",
        "defects",
        "not_judged_for_want_of_evidence",  # gate's one addition: routing adds none
    }


# --------------------------------------------------------------------------- the reader


def _bad(rec: dict[str, Any] | None = None, header: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    lines = oracle_lines(**(rec or {}))
    lines[0].update(header or {})
    return lines


@pytest.mark.parametrize(
    ("lines", "field", "message"),
    [
        (_bad(header={"moe": {"layers": [3, 0], "top_k": 2, "num_experts": 8}}), "moe.layers", "ascending"),
        (_bad(header={"moe": {"layers": [0, 3], "top_k": 9, "num_experts": 8}}), "moe.top_k", "from 1 to"),
        (_bad(header={"moe": "yes"}), "moe", "must be an object"),
        (_bad({"routed_experts": ROUTING[:4]}), "routed_experts", "has 4 entries"),
        (_bad({"routed_experts": [*ROUTING[:4], [[0, 1]]]}), "routed_experts[4]", "2 per-layer lists"),
        (_bad({"routed_experts": [*ROUTING[:4], [[0, 1], [2, 8]]]}), "routed_experts[4][1]", "out of range"),
        (_bad({"routed_experts": [*ROUTING[:4], [[0, 1], [2, 2]]]}), "routed_experts[4][1]", "chosen twice"),
        (_bad({"routed_experts": [*ROUTING[:4], [[0, 1], [2, 1.0]]]}), "routed_experts[4][1]", "integer"),
        (_bad({"router_top": []}), "router_top", "candidate traces only"),
    ],
)
def test_bad_routing_names_file_line_and_field(
    tmp_path: Path, lines: list[dict[str, Any]], field: str, message: str
) -> None:
    path = write(tmp_path / "o.jsonl", lines)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert err.value.field == field, str(err.value)
    assert message in str(err.value) and str(path) in str(err.value)
    assert err.value.line == (1 if field.startswith("moe") else 2)


def test_routing_without_a_moe_header_is_refused(tmp_path: Path) -> None:
    lines = oracle_lines()
    del lines[0]["moe"]
    with pytest.raises(TraceError, match="needs a `moe` block"):
        read_trace(write(tmp_path / "o.jsonl", lines))


def test_candidate_router_scores_out_of_order_are_refused(tmp_path: Path) -> None:
    scores = scores_for(ROUTING)
    scores[2][1] = list(reversed(scores[2][1]))
    with pytest.raises(TraceError) as err:
        read_trace(write(tmp_path / "c.jsonl", candidate_lines(TOKENS, ROUTING, scores)))
    assert err.value.field == "router_top[2][1]" and "out of order" in str(err.value)
