"""A plugin that breaks the contract is the engine's failure (exit 3) in one line naming what
it broke, and a failure of gate's cleanup never hides the plugin's own error."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.broken_plugins import OWN_ERROR
from helpers.fake_openai_server import write_fake_pin
from helpers.gate_cli import invoke

MODEL = "fake/model"


def run(tmp_path: Path, engine: str) -> tuple[int, str]:
    pins = tmp_path / "pins"
    write_fake_pin(pins, MODEL)
    r = invoke(["run", "--model", MODEL, "--pins-dir", str(pins), "--engine", engine, "--format", "json"])
    return r.exit_code, r.stderr


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gate: ")]


def test_a_plugin_without_close_is_refused_when_it_loads_naming_what_it_lacks(tmp_path: Path) -> None:
    code, err = run(tmp_path, "helpers.broken_plugins:NoClose")
    assert code == 3, err
    assert "Traceback" not in err
    (line,) = errors(err)
    assert "lacks close()" in line and "gate.engine.Engine" in line, err


def test_a_failing_close_never_hides_the_plugins_own_error(tmp_path: Path) -> None:
    code, err = run(tmp_path, "helpers.broken_plugins:CloseFails")
    assert code == 3, err
    assert "Traceback" not in err
    (line,) = errors(err)
    assert OWN_ERROR in line and "close failed" not in line, err


@pytest.mark.parametrize("fails", [True, False])
def test_open_engine_closes_once_and_keeps_the_bodys_error(fails: bool) -> None:
    from gate.errors import EngineError
    from gate.workflows.common.engine_calls import open_engine

    closed: list[int] = []

    class Engine:
        name = "e"

        def close(self) -> None:
            closed.append(1)
            if fails:
                raise RuntimeError("close failed")

    with pytest.raises(EngineError, match="in generate: RuntimeError: boom"), open_engine(Engine, "e"):  # type: ignore[arg-type]
        from gate.workflows.common.engine_calls import engine_call

        engine_call("e", "generate", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert closed == [1]
