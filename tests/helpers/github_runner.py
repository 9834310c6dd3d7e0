"""What the GitHub Actions runner does with a composite action's step, done here the runner's
way (actions/runner: `ActionCommand.TryParseV2` and `TryParse`, `ActionCommandManager`,
`SetOutputFileCommand`), so the tests judge the action by the runner's rules, not by gate's:

- `run_step`: a `run:` step of `action.yml` in bash as the runner starts it (`bash --noprofile
  --norc -eo pipefail FILE`), its `env:` resolved from the inputs (`${{ inputs.x }}`,
  `${{ github.action_path }}`), GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, GITHUB_ENV and GITHUB_PATH
  as files and GITHUB_ACTIONS=true;
- `read_outputs`: the outputs file read as the runner reads it (`name=value` and
  `name<<DELIMITER` blocks);
- `commands`: the workflow commands the runner would carry out from what a step printed:
  `::name props::data` at a line's start after spaces, the legacy `##[name props]data`
  anywhere in a line, and nothing between `::stop-commands::TOKEN` and `::TOKEN::`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"

# The commands the runner registers (its command extensions, and stop-commands).
REGISTERED = frozenset(
    {"set-env", "set-output", "save-state", "add-mask", "add-path", "add-matcher", "remove-matcher"}
    | {"debug", "warning", "error", "notice", "group", "endgroup", "echo", "stop-commands"}
)
_DATA = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_PROPERTY = (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%"))
_LEGACY = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))
_EXPR = re.compile(r"^\$\{\{\s*(inputs\.[a-z0-9-]+|github\.action_path)\s*\}\}$")


def action() -> dict[str, Any]:
    data = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _unescape(text: str, table: tuple[tuple[str, str], ...]) -> str:
    for escaped, plain in table:
        text = text.replace(escaped, plain)
    return text


@dataclass(frozen=True)
class Command:
    name: str
    properties: dict[str, str] = field(default_factory=dict)
    data: str = ""


def _parse_v2(line: str, registered: set[str]) -> Command | None:
    line = line.lstrip()
    if not line.startswith("::"):
        return None
    end = line.find("::", 2)
    if end < 0:
        return None
    info = line[2:end]
    name, _, props = info.partition(" ")
    if name not in registered:
        return None
    properties = {}
    for pair in filter(None, props.split(",")):
        key, eq, value = pair.partition("=")
        if eq and key and value:
            properties[key] = _unescape(value, _PROPERTY)
    return Command(name, properties, _unescape(line[end + 2 :], _DATA))


def _parse_v1(line: str, registered: set[str]) -> Command | None:
    start = line.find("##[")
    if start < 0:
        return None
    end = line.find("]", start)
    if end < 0:
        return None
    info = line[start + 3 : end]
    name, _, props = info.partition(" ")
    if name not in registered:
        return None
    properties = {}
    for pair in filter(None, props.split(";")):
        key, eq, value = pair.partition("=")
        if eq and key and value:
            properties[key] = _unescape(value, _LEGACY)
    return Command(name, properties, _unescape(line[end + 1 :], _LEGACY))


def commands(log: str) -> list[Command]:
    """The commands the runner carries out from `log` (a step's stdout and stderr, in the
    order printed), stop-commands and its resume token included."""
    registered = set(REGISTERED)
    stop: str | None = None
    done: list[Command] = []
    for line in re.split(r"\r\n|\r|\n", log):
        cmd = _parse_v2(line, registered) or _parse_v1(line, registered)
        if cmd is None:
            continue
        if stop is not None:
            if cmd.name == stop:
                registered.discard(stop)
                stop = None
                done.append(cmd)
            continue
        if cmd.name == "stop-commands":
            stop = cmd.data
            registered.add(stop)
        done.append(cmd)
    return done


def read_outputs(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT's `name=value` lines and `name<<DELIMITER` blocks, as the runner reads them."""
    out: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].removesuffix("\r")
        i += 1
        if not line:
            continue
        eq, here = line.find("="), line.find("<<")
        if eq >= 0 and (here < 0 or eq < here):
            name, value = line[:eq], line[eq + 1 :]
        elif here >= 0:
            name, delimiter = line[:here], line[here + 2 :]
            body: list[str] = []
            while i < len(lines) and lines[i].removesuffix("\r") != delimiter:
                body.append(lines[i].removesuffix("\r"))
                i += 1
            assert i < len(lines), f"GITHUB_OUTPUT: no closing delimiter {delimiter!r} for {name!r}"
            i += 1
            value = "\n".join(body)
        else:
            raise AssertionError(f"GITHUB_OUTPUT: invalid line {line!r}")
        assert name, f"GITHUB_OUTPUT: a line without a name: {line!r}"
        out[name] = value
    return out


@dataclass(frozen=True)
class StepRun:
    returncode: int
    log: str  # stderr, then stdout
    outputs: dict[str, str]
    summary: str
    env_file: str
    path_file: str


def resolve_env(step: Mapping[str, Any], inputs: Mapping[str, str]) -> dict[str, str]:
    """The step's `env:` with each `${{ inputs.x }}` given its value (the input, else the
    action's default) and `${{ github.action_path }}` the checkout; anything else is refused."""
    declared = action()["inputs"]
    out = {}
    for name, expr in (step.get("env") or {}).items():
        m = _EXPR.match(str(expr))
        assert m, f"env {name}: {expr!r} is not one input or the action path"
        ref = m.group(1)
        if ref == "github.action_path":
            out[name] = str(ROOT)
        else:
            key = ref.removeprefix("inputs.")
            assert key in declared, f"env {name}: no input {key!r} in action.yml"
            out[name] = inputs.get(key, str(declared[key].get("default", "")))
    return out


def run_step(
    step: Mapping[str, Any],
    inputs: Mapping[str, str],
    cwd: Path,
    *,
    path_prepend: Path | None = None,
    runner_env: Mapping[str, str] | None = None,
) -> StepRun:
    """Run one `run:` step of the composite action in `cwd` as the runner would."""
    cwd.mkdir(parents=True, exist_ok=True)
    files = {
        k: cwd / f".runner-{k.lower()}" for k in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ENV", "GITHUB_PATH")
    }
    for f in files.values():
        f.write_text("")
    script = cwd / ".runner-step.sh"
    script.write_text(step["run"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATE_", "GITHUB_", "RUNNER_"))}
    env.update({k: str(v) for k, v in files.items()})
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "CI": "true",
            "GITHUB_ACTION_PATH": str(ROOT),
            "GITHUB_WORKSPACE": str(cwd),
            "RUNNER_TEMP": str(cwd),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    if path_prepend is not None:
        env["PATH"] = f"{path_prepend}{os.pathsep}{env['PATH']}"
    env.update(runner_env or {})
    env.update(resolve_env(step, inputs))
    assert step.get("shell") == "bash", step.get("name")
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = files["GITHUB_OUTPUT"]  # the runner's own file (a test may point the step elsewhere)
    return StepRun(
        returncode=r.returncode,
        # The runner reads stdout and stderr from two pipes, in no fixed order between them:
        # stdout is taken as read last, the order in which its lines could escape a bracket.
        log=r.stderr + r.stdout,
        outputs=read_outputs(output.read_bytes().decode("utf-8")) if output.is_file() else {},
        summary=files["GITHUB_STEP_SUMMARY"].read_text() if files["GITHUB_STEP_SUMMARY"].is_file() else "",
        env_file=files["GITHUB_ENV"].read_text(),
        path_file=files["GITHUB_PATH"].read_text(),
    )


def python3_here(folder: Path) -> Path:
    """A folder whose `python3` is this test session's Python (the runner's `python3`, with gate)."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / "python3"
    if not launcher.exists():
        # Not a symlink: a venv's Python finds its environment from the path it was started by.
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        launcher.chmod(0o755)
    return folder


def step(name: str) -> dict[str, Any]:
    """The step of action.yml named `name`."""
    found = [s for s in action()["runs"]["steps"] if s.get("name") == name]
    assert len(found) == 1, name
    return found[0]


def gate_step(tmp_path: Path, runner_env: Mapping[str, str] | None = None, **inputs: str) -> StepRun:
    """The action's Gate step in `tmp_path`, `inputs` (snake_case names) as the workflow's `with:`."""
    named = {k.replace("_", "-"): v for k, v in inputs.items()}
    return run_step(
        step("Gate"), named, tmp_path, path_prepend=python3_here(tmp_path.parent / "bin"), runner_env=runner_env
    )


def annotations(log: str) -> list[tuple[str, str]]:
    """The (command, data) pairs the runner would carry out from `log`, less the step's own
    stop-commands and its resume token."""
    found = commands(log)
    stops = {c.data for c in found if c.name == "stop-commands"}
    return [(c.name, c.data) for c in found if c.name != "stop-commands" and c.name not in stops]
