"""A server that answers as another model (its answers and `/v1/models` name `gpt2` where
the pin's model was asked): every report format carries it beside the verdict, not only a
warning on stderr, and so does a trace it wrote when judged again by `gate compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fake_openai_server import FakeOpenAIServer, write_fake_pin
from helpers.gate_cli import invoke

FORMATS = ("rich", "markdown", "json", "html", "junit")
SAID = "answered as model 'gpt2', not 'fake/model' as asked"
LISTED = "lists model(s) 'gpt2' and not 'fake/model'"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    folder = tmp_path_factory.mktemp("other-model")
    write_fake_pin(folder / "pins")
    saved = folder / "cand.jsonl"
    reports: dict[str, str] = {}
    stderr = ""
    with FakeOpenAIServer(answer_model="gpt2", listed_models=["gpt2"]) as srv:
        for fmt in FORMATS:
            args = ["run", "--model", "fake/model", "--pins-dir", str(folder / "pins"), "--engine", "openai"]
            args += ["--engine-opt", f"base_url={srv.url}", "--engine-opt", "model=fake/model", "--format", fmt]
            if fmt == "json":
                args += ["--save-trace", str(saved)]
            r = invoke(args)
            assert r.exit_code in (0, 1), r.output
            reports[fmt] = r.stdout
            stderr += r.stderr
    return folder, reports, stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_of_the_run_s_report_names_the_model_the_server_answered_as(
    runs: tuple[Path, dict[str, str], str], fmt: str
) -> None:
    text = " ".join(runs[1][fmt].replace("&#x27;", "'").replace("&apos;", "'").split())
    assert SAID in text, text[:3000]
    assert LISTED in text, text[:3000]


def test_the_json_report_carries_it_in_warnings(runs: tuple[Path, dict[str, str], str]) -> None:
    report = json.loads(runs[1]["json"])
    assert any(SAID in w for w in report["warnings"]), report["warnings"]


def test_the_saved_trace_judged_again_says_it_too(runs: tuple[Path, dict[str, str], str]) -> None:
    folder = runs[0]
    pin = folder / "pins" / "fake" / "model" / "pin.jsonl"
    r = invoke(["compare", str(pin), str(folder / "cand.jsonl"), "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    assert any(SAID in w for w in json.loads(r.stdout)["warnings"])
