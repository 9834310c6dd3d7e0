"""The command line stays thin: each command in the module named after it, a command's
options collected into one request record (nothing dropped on the way to the workflow),
`gate --help` loading no workflow, engine or numerical library, and typer the only CLI
library imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from typer.main import get_command

import gate.cli.compare as compare_cli
import gate.cli.run as run_cli
from gate.cli.main import app
from gate.cli.options import ReportTarget
from gate.workflows.common.requests import DoctrineFlags, EngineRequest
from gate.workflows.run.compare import CompareRequest
from gate.workflows.run.request import RunRequest

ROOT = Path(__file__).resolve().parents[2]


def test_each_command_lives_in_the_module_named_after_it() -> None:
    seen = []
    for info in app.registered_commands:
        assert info.name is not None
        assert info.callback is not None
        assert info.callback.__module__ == f"gate.cli.{info.name.replace('-', '_')}", info.name
        seen.append(info.name)
    for group in app.registered_groups:
        assert group.typer_instance is not None
        name = group.typer_instance.info.name
        for info in group.typer_instance.registered_commands:
            assert info.callback is not None
            assert info.callback.__module__ == f"gate.cli.{name}", f"{name} {info.name}"
            seen.append(f"{name} {info.name}")
    assert {"run", "merge", "calibrate", "selftest", "export-prompts", "pin record", "goldens check"} <= set(seen)


def _captured(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> dict[str, Any]:
    got: dict[str, Any] = {}

    def capture(**kwargs: Any) -> int:
        got.update(kwargs)
        return 0

    monkeypatch.setattr(module, name, capture)
    return got


# Every option of `gate run`, each given a value other than its default.
RUN_ARGS = {
    "--model": ["m/x"],
    "--engine": ["toy"],
    "--engine-opt": ["a=1", "b=2"],
    "--model-path": ["weights"],
    "--near-tie-mnats": ["50"],
    "--near-tie-ulps": ["2"],
    "--no-evidence": [],
    "--strict": [],
    "--format": ["json"],
    "--output": ["report.json"],
    "--details": [],
    "--save-trace": ["cand.jsonl"],
    "--candidate-trace": ["given.jsonl"],
    "--pins-dir": ["pins"],
    "--force": [],
    "--timings": [],
    "--shard": ["1/2"],
    "--resume": [],
    "--progress-file": ["progress.jsonl"],
    "--timeout": ["5"],
    "--repeat": ["3"],
}


def test_every_run_option_reaches_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    run_params = get_command(app).commands["run"].params  # type: ignore[attr-defined]
    declared = {p.opts[0] for p in run_params if p.opts[0].startswith("--")}
    assert declared - {"--help"} == set(RUN_ARGS), "a new `gate run` option: give it a value here"
    got = _captured(monkeypatch, run_cli, "run_gate")
    args = ["run"]
    for flag, values in RUN_ARGS.items():
        args += [flag, *values] if len(values) <= 1 else [x for v in values for x in (flag, v)]
    r = invoke(args)
    assert r.exit_code == 0, r.output
    assert got == {
        "request": RunRequest(
            model="m/x",
            engine=EngineRequest("toy", ("a=1", "b=2"), Path("weights")),
            doctrine=DoctrineFlags(50.0, 2.0, True),
            strict=True,
            candidate_trace=Path("given.jsonl"),
            save_trace=Path("cand.jsonl"),
            pins_dir=Path("pins"),
            force=True,
            shard="1/2",
            resume=True,
            progress_file=Path("progress.jsonl"),
            timeout=5.0,
            repeat=3,
        ),
        "report": ReportTarget("json", Path("report.json"), True, True),
        "timings": True,
    }


def test_compare_options_reach_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    got = _captured(monkeypatch, compare_cli, "compare_files")
    r = invoke(
        ["compare", "o.jsonl", "c.jsonl", "--near-tie-ulps", "1", "--strict", "-o", "r.md", "--format", "markdown"]
    )
    assert r.exit_code == 0, r.output
    assert got == {
        "request": CompareRequest(Path("o.jsonl"), Path("c.jsonl"), DoctrineFlags(near_tie_ulps=1.0), strict=True),
        "report": ReportTarget("markdown", Path("r.md"), False),
    }


def test_help_loads_no_workflow_engine_or_numerical_library() -> None:
    probe = (
        "import sys\n"
        "from gate.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(proc.stderr.split())
    assert "gate.cli.run" in loaded and "gate.cli.goldens" in loaded  # the probe sees the commands
    below = sorted(m for m in loaded if m.startswith(("gate.workflows", "gate.engines", "gate.core", "gate.reports")))
    assert not below, below
    heavy = {"numpy", "torch", "transformers", "vllm", "orjson", "httpx"} & {m.split(".")[0] for m in loaded}
    assert not heavy, sorted(heavy)


def test_typer_is_the_only_cli_library_imported() -> None:
    # Typer bundles its own click: `import click`, `from click import ...` and typer's private copy are all refused.
    for path in sorted((ROOT / "gate" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] != "click" and not name.startswith("typer._click"), f"{path}: {name}"
