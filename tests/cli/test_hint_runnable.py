"""A hint is only printed when its command can run: after a failed `gate run`, the
`gate diagnose` command is suggested only for an engine gate diagnose can capture."""

from __future__ import annotations

from pathlib import Path

from helpers.fake_openai_server import FakeModel, FakeOpenAIServer, write_fake_pin
from helpers.gate_cli import invoke

from gate.cli.diagnose import diagnose_hint
from gate.core.verdict.result import FAIL


def test_no_diagnose_hint_after_a_failed_run_of_an_engine_diagnose_cannot_capture(tmp_path: Path) -> None:
    # The server's model is not the pin's: its tokens diverge, the run fails.
    write_fake_pin(tmp_path / "pins", fake=FakeModel(vocab=499))
    args = ["run", "--model", "fake/model", "--pins-dir", str(tmp_path / "pins"), "--engine", "openai"]
    with FakeOpenAIServer() as srv:
        r = invoke([*args, "--engine-opt", f"base_url={srv.url}"])
    assert r.exit_code == 1, r.output
    assert "gate diagnose" not in r.stderr, r.stderr
    # The command it would have printed exits 2 for this engine: that is why it is not printed.
    d = invoke(["diagnose", "--model", "fake/model", "--pins-dir", str(tmp_path / "pins"), "--engine", "openai"])
    assert d.exit_code == 2 and "cannot capture engine 'openai'" in d.stderr


def test_the_diagnose_hint_is_kept_for_an_engine_diagnose_captures() -> None:
    from types import SimpleNamespace

    div = SimpleNamespace(cls="defect", prompt_id="p0", position=3, source="free", forced_mode=None)
    result = SimpleNamespace(verdict=FAIL, divergences=[div], prompts=[SimpleNamespace(id="p0")], distribution=None)
    hint = diagnose_hint(result, model="m", engine="hf", engine_opts=None)  # type: ignore[arg-type]
    assert hint is not None and "gate diagnose --model m --engine hf" in hint
    assert diagnose_hint(result, model="m", engine="openai", engine_opts=None) is None  # type: ignore[arg-type]
    assert diagnose_hint(result, model="m", engine="no-such-engine", engine_opts=None) is None  # type: ignore[arg-type]


def test_hints_quote_their_arguments_so_the_command_runs_as_printed(tmp_path: Path) -> None:
    import shlex

    import pytest

    from gate.core.goldens.golden import find_golden
    from gate.core.pins.pin import find_folder
    from gate.errors import GateError

    spaced = tmp_path / "my pins"
    spaced.mkdir()
    with pytest.raises(GateError) as info:
        find_folder("org/model", spaced)
    hint = info.value.hint or ""
    assert shlex.split(hint)[:4] == ["gate", "pin", "record", "--model"]
    assert str(spaced) in shlex.split(hint), hint
    with pytest.raises(GateError) as info:
        find_golden("org/model", "hf", tmp_path / "my goldens", pins_dir=spaced)
    words = shlex.split(info.value.hint or "")
    assert str(tmp_path / "my goldens") in words and str(spaced) in words, info.value.hint


def test_a_failure_by_the_distribution_alone_gets_the_diffuse_hint_and_no_position() -> None:
    from types import SimpleNamespace

    tie = SimpleNamespace(cls="exact_tie", prompt_id="p0", position=3, source="free_run", forced_mode=None)
    beyond = SimpleNamespace(beyond=True, disagrees=False)
    result = SimpleNamespace(verdict=FAIL, divergences=[tie], prompts=[SimpleNamespace(id="p0")], distribution=beyond)
    hint = diagnose_hint(result, model="m", engine="hf", engine_opts=None)  # type: ignore[arg-type]
    assert hint is not None and hint.startswith("the gate failed by its distribution with no defect: the failure is")
    assert "gate diagnose --model m --engine hf reruns the gate" in hint and "--prompt" not in hint
    # A failure the distribution could not judge is not called diffuse: the first divergence is named.
    unjudged = SimpleNamespace(beyond=False, disagrees=False)
    hint = diagnose_hint(SimpleNamespace(**{**vars(result), "distribution": unjudged}), model="m", engine="hf",
                         engine_opts=None)  # type: ignore[arg-type]  # fmt: skip
    assert hint is not None and hint.startswith("the first divergence (exact tie) is prompt p0, position 3")
