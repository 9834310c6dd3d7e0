"""The command line's surface: one choice of formats per command (the renderers'), exit codes
in every command's help, no stale defaults, install hints for extras that exist, counts in
the right number, and a bug in gate reported as one (exit 4), not as the engine's failure."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
from helpers.gate_cli import invoke
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE
from typer.main import get_command
from typer.testing import CliRunner

from gate import DISTRIBUTION, install_line
from gate.cli import options
from gate.cli.main import app
from gate.engines.registry import ENGINE_EXTRAS
from gate.errors import INTERNAL_ERROR_EXIT
from gate.reports import formats
from gate.text import plural

ROOT = Path(__file__).resolve().parents[2]


def commands() -> dict[str, Any]:
    """Every leaf command (typer's own click objects), by its path (`gate goldens check`)."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        if hasattr(cmd, "commands"):  # a group
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")
        else:
            out[path] = cmd

    walk(get_command(app), "gate")
    return out


def test_each_format_choice_is_what_the_renderers_render() -> None:
    assert [f.value for f in options.GateFormat] == list(formats("GateResult"))
    assert [f.value for f in options.GoldensFormat] == list(formats("GoldensResult"))
    assert [f.value for f in options.RichOrJson] == list(formats("Calibration")) == list(formats("SelfTestResult"))


def help_text(path: str) -> str:
    r = CliRunner().invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, (path, r.output)
    return " ".join(r.stdout.split())


def test_every_format_option_is_a_choice() -> None:
    for path in commands():
        if "--format" not in help_text(path):
            continue
        r = invoke([*path.split()[1:], "--format", "yaml"])
        assert r.exit_code == 2 and "'yaml' is not one of 'rich'" in r.stderr, (path, r.stderr)


def test_every_command_says_its_exit_codes_and_no_stale_default() -> None:
    for path in commands():
        text = help_text(path)
        assert "Exit codes: 0 " in text, path
        assert "[default: 125]" not in text, path  # the pin's doctrine decides, not a fixed 125


def test_the_invariance_help_names_every_cell() -> None:
    from gate.workflows.invariance.core import CELLS

    text = help_text("gate invariance").split("--schedules", 1)[1].split("--batch", 1)[0]
    assert [c for c in CELLS if c not in text] == []


def test_hidden_aliases_stay_out_of_the_help() -> None:
    merge = help_text("gate merge")
    assert "--model" in merge and "--pin-model" not in merge
    record = help_text("gate goldens record")
    assert "--force" in record and "--accept" not in record


def _extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == DISTRIBUTION
    return set(pyproject["project"]["optional-dependencies"])


def test_every_install_hint_names_extras_that_exist() -> None:
    extras = _extras()
    named: list[str] = []
    for path in (ROOT / "gate").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_line":
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}: install_line takes a literal"
                named += str(arg.value).split(",")
        assert "gate[" not in path.read_text(), f"{path}: an install line names the wrong distribution"
    for line in ENGINE_EXTRAS.values():
        named += [x for m in re.findall(r"\[([^\]]+)\]", line) for x in m.split(",")]
    assert named and set(named) <= extras, set(named) - extras
    assert install_line("hf") == f"pip install '{DISTRIBUTION}[hf]'"


def test_every_install_line_in_the_docs_uses_the_distribution_name() -> None:
    extras = _extras()
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        text = doc.read_text()
        assert not re.search(r"pip install[^\n`]*'gate\[", text), doc
        assert not re.search(r"`gate\[", text), doc
        for group in re.findall(rf"{DISTRIBUTION}\[([^\]]+)\]", text):
            assert set(group.split(",")) <= extras, (doc, group)


def test_an_engine_hint_for_an_extra_that_does_not_exist_is_not_given() -> None:
    assert "openai" not in ENGINE_EXTRAS  # the openai engine needs no extra
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for engine, hint in ENGINE_EXTRAS.items():
        named = {name for group in re.findall(r"\[([^\]]+)\]", hint) for name in group.split(",")}
        assert named and named <= extras, (engine, hint, named - extras)


@pytest.mark.parametrize(
    ("n", "one", "said"),
    [(0, "exact tie", "0 exact ties"), (1, "exact tie", "1 exact tie"), (2, "prompt", "2 prompts")],
)
def test_plural(n: int, one: str, said: str) -> None:
    assert plural(n, one) == said


def test_reports_count_one_in_the_singular(tmp_path: Path) -> None:
    r = invoke(["compare", str(SEED_ORACLE), str(SEED_CANDIDATE), "--details"])  # the profile is a detail
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "(1 exact tie, 0 near ties, 0 defects)" in text
    assert "#2 at 1 position," in text and "1 positions" not in text
    assert "1 exact ties" not in text and "the 1 prompts" not in text


def test_a_bug_in_gate_is_an_internal_error_not_an_engine_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import gate.cli.compare as compare_cli

    def broken(**_: object) -> int:
        raise KeyError("oops")

    monkeypatch.setattr(compare_cli, "compare_files", broken)
    r = invoke(["compare", str(SEED_ORACLE), str(SEED_CANDIDATE)])
    assert r.exit_code == INTERNAL_ERROR_EXIT == 4, r.output
    lines = r.stderr.splitlines()
    assert lines[0] == "gate: internal error (a bug in gate, please report it): KeyError: 'oops'"
    assert lines[1] == "hint: set GATE_DEBUG=1 for the traceback"
    assert "engine" not in r.stderr


def test_a_hint_is_its_own_line_never_a_newline_inside_the_message(tmp_path: Path) -> None:
    r = invoke(["pin", "show", "--model", "nobody/none", "--pins-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and "\\n" not in r.stderr
    assert lines[0].startswith("gate: error: no pin folder for nobody/none")
    assert lines[1] == f"hint: gate pin record --model nobody/none --pins-dir {tmp_path} --prompts SUITE.jsonl"


def click_imports(source: str) -> list[str]:
    """Every import of click (`import click`, `from click import ...`, `import click.testing`)
    or of typer's private modules (its bundled click among them) in a module's source."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] == "click" or (parts[0] == "typer" and any(p.startswith("_") for p in parts[1:])):
                found.append(name)
    return found


@pytest.mark.parametrize(
    ("source", "hit"),
    [
        ("import click\n", True),
        ("from click import echo\n", True),
        ("import click.testing as t\n", True),
        ("def f():\n    from click.exceptions import Exit\n", True),
        ("from typer._click import Context\n", True),
        ("from typer import _click\n", True),
        ("import typer\nfrom typer.testing import CliRunner\n# import click\n", False),
        ("x = 'from click import echo'\n", False),
    ],
)
def test_the_click_check_sees_every_way_in(source: str, hit: bool) -> None:
    assert bool(click_imports(source)) is hit


def test_typer_is_the_only_cli_import() -> None:
    # The house style: typer bundles its own click; gate imports only typer.
    for path in sorted((ROOT / "gate").rglob("*.py")):
        assert click_imports(path.read_text()) == [], path
    assert typer is not None


@pytest.mark.parametrize("module", ["gate", "gate.cli.main"])
def test_both_module_entry_points_run_the_cli(module: str) -> None:
    """`python -m gate.cli.main` printed nothing and exited 0 (the module had no main guard)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gate "), (out.stdout, out.stderr)
