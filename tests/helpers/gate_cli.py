"""Helpers for CLI tests: run `gate` exactly as the console script does, and lay out pin
folders for the fake engine.

`invoke` runs `gate.cli.main.main`, the console script's entry, inside typer's CliRunner,
so a GateError goes through the one place that maps it to an exit code and a message on
stderr: a test then sees the very exit status and message a person would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from gate.cli.main import main
from gate.engines import registry

_shell = typer.Typer(add_completion=False)


@_shell.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def _gate(ctx: typer.Context) -> None:
    main(list(ctx.args))


def invoke(args: Sequence[str], env: dict[str, str] | None = None) -> Result:
    """`gate ARGS` through the console script's `main()`; stdout and stderr kept apart."""
    return CliRunner().invoke(_shell, list(args), env={"COLUMNS": "120", **(env or {})})


def register_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `--engine fake` (and oracle.json's `"engine": "fake"`) the toy engine."""
    from helpers.fake_engine import FakeEngine

    monkeypatch.setitem(registry.BUILTIN, "fake", f"{FakeEngine.__module__}:FakeEngine")
    FakeEngine.history.clear()


TOY_MODEL = "toy/model"


def toy_suite(n: int = 6, max_tokens: int | None = 12) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"p{i:02d}"}
        if i % 3 == 2:
            row["messages"] = [{"role": "user", "content": f"question number {i}?"}]
        else:
            row["text"] = f"prompt number {i}: import numpy as np"
        if max_tokens is not None:
            row["max_tokens"] = max_tokens
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def toy_pin_folder(
    root: Path,
    model: str = TOY_MODEL,
    *,
    n: int = 6,
    max_tokens: int = 12,
    engine_options: dict[str, Any] | None = None,
) -> Path:
    """A pin folder with a suite and an oracle.json that records with the fake engine."""
    folder = root.joinpath(*model.split("/"))
    write_jsonl(folder / "suite.jsonl", toy_suite(n, max_tokens))
    settings = {"model": model, "engine": "fake", "dtype": "toy", "max_tokens": max_tokens, "top_k": 5}
    if engine_options:
        settings["engine_options"] = engine_options
    (folder / "oracle.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


def record_toy_pin(root: Path, model: str = TOY_MODEL, **kwargs: Any) -> Path:
    folder = toy_pin_folder(root, model, **kwargs)
    r = invoke(["pin", "record", "--model", model, "--pins-dir", str(root)])
    assert r.exit_code == 0, r.output
    return folder


def run_fake(pins: Path, *args: str) -> Result:
    """`gate run` of the fake engine against the toy pin in `pins`, JSON report on stdout."""
    return invoke(["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", "fake", "--format", "json", *args])
