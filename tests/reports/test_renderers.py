"""The renderers: pure functions of the result, each checked for what a reader relies on."""

from __future__ import annotations

import copy
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.trace_builders import mixed_result
from rich.console import Console

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import DEFECT, EXACT_TIE, Divergence, GateResult, PromptResult
from gate.reports import render, trim_line_ends
from gate.reports.html import render_html
from gate.reports.html_plots import bars_from_values
from gate.reports.junit import render_junit
from gate.reports.markdown import render_markdown
from gate.reports.terminal import print_report, render_text

TIE_RULE = "torch.argmax and vLLM take the lowest id among equal maxima"


@pytest.fixture(scope="session", autouse=True)
def fixed_width() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "120")
        yield


@pytest.fixture
def mixed(tmp_path: Path) -> GateResult:
    return mixed_result(tmp_path)


def many(result: GateResult, n: int) -> GateResult:
    """`result` with its divergences repeated over `n` extra defect prompts."""
    d0 = next(d for d in result.divergences if d.cls == DEFECT)
    p0 = next(p for p in result.prompts if p.id == d0.prompt_id)
    prompts = [*result.prompts]
    divs = [*result.divergences]
    for i in range(n):
        pid = f"extra-{i:03d}"
        prompts.append(replace(p0, id=pid))
        divs.append(replace(d0, prompt_id=pid))
    return replace(result, prompts=tuple(prompts), divergences=tuple(divs))


# --------------------------------------------------------------------------- terminal


def test_text_report_lays_out_every_divergence_kind(mixed: GateResult) -> None:
    text = render_text(mixed, details=True)
    assert "\x1b[" not in text
    assert all(len(line) <= 100 for line in text.splitlines())
    flat = " ".join(line.strip(" │") for line in text.splitlines())
    for needle in (
        "EXACT TIE",
        "NEAR TIE",
        "DEFECT",
        "forced (decode)",
        "forced (prefill)",
        "free run",
        '464 "import"',
        '1445 "from"',
        "= bit for bit",
        "rank 2 in the oracle's top-k",
        "not in the oracle's top-k",
        "none (stopped early)",
        "≥ 4,750.0",
        TIE_RULE,
        '"near | tie `x`\\nline two"',
        "125.0-mnat threshold",
    ):
        assert needle in flat, needle
    assert text.splitlines()[-2] == mixed.summary
    assert text.splitlines()[-1] == "verdict: fail (exit 1: 4 defects)"


def test_text_report_stays_short_with_hundreds_of_divergences(mixed: GateResult) -> None:
    big = many(mixed, 300)
    assert render_text(big).count("╭─") == 3  # the first defects in full; --details shows more
    text = render_text(big, details=True)
    panels = text.count("╭─")
    assert panels == 12  # the first divergences in full
    assert "The other 296 divergences" in text
    assert "extra-299" in text  # every divergence still listed, one row each
    assert len(text.splitlines()) < 12 * 16 + 300 + 120


def test_prompt_table_lists_only_diverged_prompts_when_many(tmp_path: Path) -> None:
    base = mixed_result(tmp_path)
    strict = next(p for p in base.prompts if p.strict and not any(d.prompt_id == p.id for d in base.divergences))
    prompts = (*base.prompts, *(replace(strict, id=f"ok-{i}") for i in range(60)))
    text = render_text(replace(base, prompts=prompts))
    assert "ok-59" not in text and "61 more prompts not listed" in text.replace("\n", " ")


def test_print_report_colours_classes(mixed: GateResult) -> None:
    console = Console(record=True, width=120, force_terminal=True, color_system="truecolor")
    print_report(mixed, console, details=True)
    html = console.export_html(inline_styles=True)
    assert "EXACT TIE" in html and "#008080" in html  # cyan for exact ties
    assert "#800000" in html or "#ff0000" in html  # red for defects


def test_render_dispatch_matches_the_renderers(mixed: GateResult) -> None:
    assert render(mixed, "markdown") == render_markdown(mixed)
    assert render(mixed, "junit") == render_junit(mixed)
    assert render(mixed, "rich") == trim_line_ends(render_text(mixed))
    assert render(mixed, "html") == render_html(mixed)


FORMATS = ("json", "markdown", "junit", "rich", "html")


def test_renderers_are_pure(mixed: GateResult, monkeypatch: pytest.MonkeyPatch) -> None:
    # A function of the result alone: not of its identity, of what was rendered before, of
    # the clock or the time zone; and the result (nested containers included) is left as it was.
    snapshot = copy.deepcopy(mixed)
    first = {fmt: render(mixed, fmt) for fmt in FORMATS}
    assert mixed == snapshot and mixed.to_dict() == snapshot.to_dict()
    other = many(mixed, 3)
    for fmt in FORMATS:
        assert render(other, fmt) != first[fmt], fmt  # the output does depend on the result
    monkeypatch.setattr(time, "time", lambda: 4102444800.0)  # 2100-01-01
    monkeypatch.setattr(time, "time_ns", lambda: 4102444800 * 10**9)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        for fmt in FORMATS:
            assert render(copy.deepcopy(mixed), fmt) == first[fmt], fmt
    finally:
        monkeypatch.undo()
        time.tzset()
    assert mixed == snapshot


# --------------------------------------------------------------------------- markdown


def _cells(row: str) -> list[str]:
    # split on pipes not escaped with a backslash
    return re.split(r"(?<!\\)\|", row.strip())[1:-1]


def test_markdown_tables_survive_hostile_text(mixed: GateResult) -> None:
    tie = next(d for d in mixed.divergences if d.cls == EXACT_TIE)
    hostile = replace(tie, oracle_text="a|b`c\nd", candidate_text="<script>*x*</script>")
    result = replace(mixed, divergences=(hostile, *mixed.divergences[1:]))
    md = render_markdown(result)
    tables: dict[int, int] = {}
    for line in md.splitlines():
        if line.startswith("|"):
            width = len(_cells(line))
            tables.setdefault(width, 0)
            tables[width] += 1
    assert set(tables) == {6, 13}  # every row of each table has the header's column count
    assert "<script>" not in md and r"\<script\>" in md
    assert r'"a\|b\`c\\nd"' in md
    assert md.startswith("## ❌ gate: fail\n")
    assert f"**{mixed.summary}**" in md


@pytest.mark.parametrize(
    "text",
    ["![x](https://example.com/a.png)", "[click](https://example.com)", "<https://example.com>", "`code`|x"],
)
def test_markdown_never_renders_a_token_as_a_link_or_image(mixed: GateResult, text: str) -> None:
    """A CI job summary shows the Markdown report: a candidate's token text must stay text
    (`![..](https://...)` once rendered as a live image)."""
    tie = next(d for d in mixed.divergences if d.cls == EXACT_TIE)
    hostile = replace(tie, oracle_text=text, candidate_text=text, prompt_id=text)
    md = render_markdown(replace(mixed, divergences=(hostile, *mixed.divergences[1:])))
    for live in ("![", "[click]", "`code`"):
        assert live not in md, live
    assert not re.search(r"(?<!\\)\]\(", md)  # an escaped bracket opens no link
    assert not re.search(r"(?<!\\)<https", md)  # an escaped `<` is text


def test_markdown_folds_long_tables(mixed: GateResult) -> None:
    md = render_markdown(many(mixed, 100))
    assert md.count("<details>") == 3 and md.count("</details>") == 3  # two tables folded, and the details
    assert "more divergences" in md


# --------------------------------------------------------------------------- junit


def test_junit_one_case_per_prompt(mixed: GateResult) -> None:
    root = ET.fromstring(render_junit(mixed).encode())
    (suite,) = root.findall("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == [p.id for p in mixed.prompts]
    failed = {name for name, c in cases.items() if c.find("failure") is not None}
    assert failed == {p.id for p in mixed.prompts if not p.ratified}
    assert suite.get("failures") == str(len(failed)) == root.get("failures")
    tie_out = cases["tie"].find("system-out")
    assert tie_out is not None and tie_out.text is not None
    assert "ratified, not strict: 1 exact tie" in tie_out.text and TIE_RULE in tie_out.text
    failure = cases["forced"].find("failure")
    assert failure is not None and failure.get("type") == "defect"
    assert "first defect at position 6" in (failure.get("message") or "")
    assert "forced (decode)" in (failure.text or "")
    assert cases["strict"].find("system-out") is None and cases["strict"].find("failure") is None


def test_junit_under_strict_fails_ratified_only_prompts(tmp_path: Path) -> None:
    result = mixed_result(tmp_path, Doctrine(strict=True))
    root = ET.fromstring(render_junit(result).encode())
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["tie"].find("failure")
    assert failure is not None and failure.get("type") == "not_strict"
    assert cases["prefill"].find("failure") is None  # strict free run: passes even under --strict


def test_junit_is_valid_xml_with_control_characters(mixed: GateResult) -> None:
    tie = next(d for d in mixed.divergences if d.cls == EXACT_TIE)
    weird = replace(tie, oracle_text="\x00\x1b[31m\ufffe", candidate_text="]]> & <")
    prompts = tuple(replace(p, id="tie\x07") if p.id == "tie" else p for p in mixed.prompts)
    result = replace(mixed, prompts=prompts, divergences=(replace(weird, prompt_id="tie\x07"), *mixed.divergences[1:]))
    xml = render_junit(result)
    root = ET.fromstring(xml.encode())
    assert "\\u0000\\u001b[31m\\ufffe" in xml
    names = [c.get("name") for c in root.iter("testcase")]
    assert "tie\\u0007" in names


# --------------------------------------------------------------------------- html


def test_html_is_self_contained(mixed: GateResult) -> None:
    page = render_html(mixed)
    assert page.startswith("<!doctype html>")
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", page)  # only in-page links
    assert "http://" not in page and "https://" not in page and "@import" not in page
    assert "default-src 'none'" in page  # and the browser is told to fetch nothing


def test_html_strips_colour_every_position(mixed: GateResult) -> None:
    page = render_html(mixed)
    strips = re.findall(r'<div class="strip [^"]*" data-strict="(\d)">(.*?)</div>', page)
    assert len(strips) == len(mixed.prompts)
    css = {"m": "o-match", "e": "o-exact", "n": "o-near", "d": "o-defect", "u": "o-unadj"}
    for (strict, body), p in zip(strips, mixed.prompts, strict=True):
        assert strict == str(int(p.strict))
        cells = re.findall(r'<rect x="(\d+)" y="0" width="(\d+)" height="1" class="(o-\w+)', body)
        drawn = "".join(next(k for k, v in css.items() if v == cls) * int(w) for _, w, cls in cells)
        assert drawn == p.outcomes, p.id
        assert [int(x) for x, _, _ in cells] == sorted(int(x) for x, _, _ in cells)


def test_html_links_every_divergence_to_its_card(tmp_path: Path) -> None:
    result = many(mixed_result(tmp_path), 80)  # past the cards, into the table
    page = render_html(result)
    links = set(re.findall(r'<a href="#([^"]+)">', page))
    targets = set(re.findall(r'id="(d-[^"]+)"', page))
    assert len(targets) == len(result.divergences)
    assert links <= targets
    assert page.count('<article class="div') == 60


def test_html_escapes_text(mixed: GateResult) -> None:
    tie = next(d for d in mixed.divergences if d.cls == EXACT_TIE)
    result = replace(
        mixed, divergences=(replace(tie, oracle_text="<img src=x onerror=alert(1)>"), *mixed.divergences[1:])
    )
    page = render_html(result)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_html_gap_plot_and_figures_hook(tmp_path: Path) -> None:
    figures = [
        {
            "title": "Drift of the chosen token",
            "unit": "mnats",
            "values": [0, 3, 20, 189],
            "markers": [{"at": 125, "label": "near-tie threshold"}],
            "note": "HF vs vLLM",
        },
        {"title": "Pre-binned", "unit": "steps", "edges": [0, 1, 2], "counts": [4, 1]},
        {"title": "Broken", "edges": [0, 1], "counts": [1, 2]},
        "not a figure",
    ]
    page = render_html(mixed_result(tmp_path, figures=figures))
    assert "Gap of each divergence" in page and "near-tie threshold 125.0" in page
    assert "0 (exact tie)" in page and "not in top-k" in page and "stopped early" in page
    assert "Drift of the chosen token" in page and "HF vs vLLM" in page and "Pre-binned" in page
    assert "figure Broken skipped" in page and "figure 4 skipped" in page
    no_divs = render_html(replace(mixed_result(tmp_path), divergences=()))
    assert "No divergences: no gaps to plot." in no_divs


def test_histogram_bins_put_a_gap_at_the_threshold_on_the_near_side() -> None:
    bars = {b.label: b.count for b in bars_from_values([0.0, 0.0, 125.0, 125.00000000000001, 3.0], [125.0])}
    assert bars["0"] == 2
    assert bars["100–125"] == 1 and bars["125–200"] == 1 and bars["2–5"] == 1
    assert sum(bars.values()) == 5
    assert bars_from_values([]) == []


def test_html_without_outcomes_still_draws_strict_prompts(mixed: GateResult) -> None:
    p = PromptResult(id="legacy", strict=True, ratified=True, positions=4, positions_matched=4, first_divergence=None)
    page = render_html(replace(mixed, prompts=(p,), divergences=()))
    assert '<rect x="0" y="0" width="4" height="1" class="o-match">' in page


def _unused(d: Divergence) -> None:  # keeps the import honest for type checkers
    del d


def test_gaps_in_grid_steps_when_the_oracle_has_raw_logits(tmp_path: Path) -> None:
    from helpers.trace_builders import mixed_records, write_pair

    from gate.core.traces.reader import read_trace
    from gate.core.verdict.adjudicate import compare

    oracle, cand = mixed_records()
    near = next(r for r in oracle if r["id"] == "near")
    near["token_logits"] = [20.0] * len(near["token_ids"])  # bf16 step at 16-32: 0.125 nats
    o, c = write_pair(tmp_path, oracle, cand)
    result = compare(read_trace(o), read_trace(c), Doctrine(near_tie_ulps=1.0))
    flat = " ".join(line.strip(" │") for line in render_text(result, details=True).splitlines())
    assert "oracle − candidate 125.0 mnats (1.00 grid steps of 125.0 mnats)" in flat
    assert "(1.00 grid steps)" in render_html(result)
    assert "or 1 bfloat16 grid steps" in render_markdown(result)
