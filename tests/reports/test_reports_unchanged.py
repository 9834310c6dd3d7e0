"""Reports that must not move: every case of `helpers.report_cases` (the seed example, every
outcome of the mixed traces, one pin candidate per rule of the chain, generated traces under
a distribution floor) rendered in every format of a `GateResult`, byte for byte as committed
under `tests/reports/expected/` (psf/black's `tests/data/cases/`: expected outputs as data
files). The JSON and Markdown reports are committed whole, to be read in a diff; the terminal
(with and without details), JUnit and HTML reports, ten times their size, as the SHA-256 of
their bytes (`digests.json`).

A change that moves a verdict, a rule code, a sentence or a figure of any of them fails here.
Where the change is meant, rewrite the files (`GATE_WRITE_EXPECTED=1 pytest -q
tests/reports/test_reports_unchanged.py`) and read the diff before committing it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.report_cases import CASES

from gate.core.verdict.result import GateResult
from gate.core.verdict.rules import RULES
from gate.reports import render

EXPECTED = Path(__file__).resolve().parent / "expected"
DIGESTS = EXPECTED / "digests.json"
# format -> (file suffix, or None where only its digest is committed; details)
FORMATS: dict[str, tuple[str | None, bool]] = {
    "json": (".json", False),
    "markdown": (".md", False),
    "junit": (None, False),
    "rich": (None, False),
    "rich-details": (None, True),
    "html": (None, False),
}
WRITE = os.environ.get("GATE_WRITE_EXPECTED") == "1"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GateResult]]:
    """Every case, built once, in one folder (the pin candidates share its copy of the pin)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("cases"))
        mp.setenv("COLUMNS", "120")
        yield {name: build() for name, build in CASES.items()}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_is_the_committed_one(
    results: dict[str, GateResult], case: str, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    suffix, details = FORMATS[fmt]
    text = render(results[case], fmt.split("-")[0], details=details)
    key = f"{case} {fmt}"
    if WRITE:
        EXPECTED.mkdir(exist_ok=True)
        digests = json.loads(DIGESTS.read_text(encoding="utf-8")) if DIGESTS.exists() else {}
        if suffix is None:
            digests[key] = _digest(text)
        else:
            digests.pop(key, None)
            (EXPECTED / f"{case}{suffix}").write_text(text, encoding="utf-8", newline="")
        DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip(f"wrote {key}")
    if suffix is None:
        digests = json.loads(DIGESTS.read_text(encoding="utf-8"))
        assert key in digests, f"{key} has no digest in {DIGESTS}: GATE_WRITE_EXPECTED=1 writes it"
        assert _digest(text) == digests[key], f"{key} moved (its SHA-256 is not the committed one)"
        return
    path = EXPECTED / f"{case}{suffix}"
    assert path.exists(), f"{path} is missing: GATE_WRITE_EXPECTED=1 writes it"
    expected = path.read_bytes().decode("utf-8")
    assert text == expected, f"{key} moved: diff it against {path}"


def test_the_cases_end_in_every_rule_of_the_chain(results: dict[str, GateResult]) -> None:
    """A rule no case ends in could change its sentence or its reach unseen: a new rule
    needs a case here."""
    decided = {d.rule for r in results.values() for d in r.divergences}
    assert decided == set(RULES), set(RULES) ^ decided


def test_the_cases_show_every_verdict_and_distribution_outcome(results: dict[str, GateResult]) -> None:
    verdicts = {r.verdict for r in results.values()}
    assert verdicts == {"strict_pass", "ratified_pass", "fail"}, verdicts
    dist = [r.distribution for r in results.values() if r.distribution is not None]
    assert any(d.beyond for d in dist) and any(d.disagrees for d in dist)
    assert any(not (d.beyond or d.insufficient or d.disagrees) for d in dist)
    assert any(r.not_greedy_total for r in results.values()) and any(
        r.drift is not None and r.drift.beyond for r in results.values()
    )
