"""`action.yml` judged by the ecosystem's own tools and rules, not by gate's reading of it:
GitHub's action schema (check-jsonschema's vendored copy), zizmor's audits (offline), and
actionlint (with shellcheck) on every workflow the docs show, taken from the Markdown by a
Markdown parser so the docs cannot drift; and the composite's structure as the runner
reads it (YAML, not text)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.github_runner import ACTION, ROOT, action
from markdown_it import MarkdownIt

BIN = Path(sys.executable).parent
# A third-party action pinned as GitHub advises: a full commit SHA, the release in a comment.
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s+([\w.-]+/[\w.-]+)@([0-9a-f]{40})\s+#\s+v\d+(?:\.\d+)*\s*$")


def tool(name: str) -> str:
    """A checker installed beside this Python (scripts/install.sh --dev), else on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is not installed: scripts/install.sh --dev installs it (the dev extra)"
    return str(found)


def check(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_action_yml_is_valid_against_githubs_action_schema() -> None:
    r = check([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(ACTION)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_action_schema_check_refuses_a_broken_action(tmp_path: Path) -> None:
    """The check can fail: the plain scalar with `: ` that once made the action unloadable,
    and an input of the wrong type."""
    text = ACTION.read_text()
    broken = tmp_path / "action.yml"
    broken.write_text(text.replace("inputs:\n", "inputs:\n  x:\n    description: a: b\n", 1))
    assert check([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(broken)]).returncode != 0
    broken.write_text(text.replace("  using: composite", "  using: compost", 1))
    assert check([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(broken)]).returncode != 0


def test_zizmor_finds_nothing_in_the_action() -> None:
    r = check([tool("zizmor"), "--offline", "--no-progress", str(ACTION)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_zizmor_would_find_an_unpinned_action_or_an_input_pasted_into_a_script(tmp_path: Path) -> None:
    text = ACTION.read_text()
    for bad in (
        re.sub(r"actions/setup-python@[0-9a-f]{40}", "actions/setup-python@v5", text),
        text.replace("run: python3 -m gate.integrations.github_action", 'run: echo "${{ inputs.model }}"', 1),
    ):
        assert bad != text
        (tmp_path / "action.yml").write_text(bad)
        r = check([tool("zizmor"), "--offline", "--no-progress", str(tmp_path / "action.yml")])
        assert r.returncode != 0, r.stdout


def test_third_party_actions_are_pinned_by_full_commit_sha_with_the_release_in_a_comment() -> None:
    lines = [line for line in ACTION.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
    assert len(lines) >= 2
    for line in lines:
        assert PINNED.match(line), line


def test_run_steps_take_inputs_only_through_env() -> None:
    """Each `run:` script holds no expression (`${{ ... }}`): an input pasted into a script is
    code the caller's text can write; through `env:` it stays data."""
    steps = action()["runs"]["steps"]
    runs = [s for s in steps if "run" in s]
    assert len(runs) >= 2
    for step in runs:
        assert "${{" not in step["run"], step.get("name")
        assert step["shell"] == "bash"


def test_every_output_is_one_the_gate_step_writes_under_its_own_name() -> None:
    outputs = action()["outputs"]
    for name, spec in outputs.items():
        assert spec["value"] == f"${{{{ steps.gate.outputs.{name} }}}}", name
        assert spec.get("description"), name


# ----------------------------------------------------------------------------- the docs' workflows


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def workflow_fences() -> list[tuple[str, str]]:
    """(page:line, text) of each YAML code fence of the docs that is a workflow or a part of
    one (a list of steps, or one step)."""
    md = MarkdownIt("commonmark")
    found = []
    for page in doc_pages():
        for token in md.parse(page.read_text(encoding="utf-8")):
            if token.type != "fence" or token.info.strip().split(" ")[0] not in ("yaml", "yml"):
                continue
            data = yaml.safe_load(token.content)
            is_steps = isinstance(data, list) and all(isinstance(s, dict) and ("uses" in s or "run" in s) for s in data)
            if (isinstance(data, dict) and "jobs" in data) or is_steps:
                line = token.map[0] + 1 if token.map else 0
                found.append((f"{page.relative_to(ROOT)}:{line}", token.content))
    return found


def as_workflow(text: str) -> str:
    """A whole workflow for actionlint: a list of steps goes into one job; gate's own action
    (`OWNER/gate@REF` in the docs) becomes the local `./`, so actionlint checks each `with:`
    against this action.yml's inputs."""
    data: Any = yaml.safe_load(text)
    if isinstance(data, list):  # PyYAML reads a workflow's `on:` as True: only a list is rewritten
        wrapped = {"on": "push", "permissions": {}, "jobs": {"gate": {"runs-on": "ubuntu-latest", "steps": data}}}
        text = yaml.safe_dump(wrapped, sort_keys=False)
    return text.replace("OWNER/gate@REF", "./")


def actionlint(project: Path, workflows: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """actionlint over `workflows` in a throwaway repository holding this action.yml."""
    (project / ".git").mkdir(parents=True, exist_ok=True)
    (project / ".github" / "workflows").mkdir(parents=True, exist_ok=True)
    shutil.copy(ACTION, project / "action.yml")
    # The GPU guide's self-hosted runner label, declared as its users declare it.
    (project / ".github" / "actionlint.yaml").write_text("self-hosted-runner:\n  labels: [gpu]\n")
    for name, text in workflows.items():
        (project / ".github" / "workflows" / name).write_text(text)
    argv = [tool("actionlint"), "-shellcheck", tool("shellcheck"), "-no-color", "-oneline"]
    return check(argv, cwd=project)


def test_every_workflow_the_docs_show_passes_actionlint(tmp_path: Path) -> None:
    fences = workflow_fences()
    pages = {where.split(":")[0] for where, _ in fences}
    assert "docs/guides/ci.md" in pages and len(fences) >= 4, fences
    names = {f"doc{n}.yml": where for n, (where, _) in enumerate(fences)}
    r = actionlint(tmp_path, {f"doc{n}.yml": as_workflow(text) for n, (_, text) in enumerate(fences)})
    report = r.stdout
    for name, where in names.items():
        report = report.replace(f".github/workflows/{name}", f"{where} (as {name})")
    assert r.returncode == 0, report + r.stderr


@pytest.mark.parametrize(
    ("step", "said"),
    [
        ({"uses": "OWNER/gate@REF", "with": {"no-such-input": "x"}}, "no-such-input"),
        ({"run": 'echo "${{ github.event.pull_request.title }}"'}, "github.event.pull_request.title"),
        ({"run": "dir=$(pwd)\ncd $dir"}, "SC2086"),
    ],
)
def test_actionlint_would_refuse_a_wrong_input_an_injection_or_a_shell_bug(
    tmp_path: Path, step: dict[str, Any], said: str
) -> None:
    r = actionlint(tmp_path, {"bad.yml": as_workflow(yaml.safe_dump([step]))})
    assert r.returncode != 0 and said in r.stdout, r.stdout + r.stderr


def test_every_input_reaches_a_step() -> None:
    """Each declared input is read by a step (its `env:`, `with:` or `if:`): an input no step
    reads would be accepted and silently ignored."""
    steps = yaml.safe_dump(action()["runs"]["steps"])
    for name in action()["inputs"]:
        assert re.search(rf"\binputs\.{re.escape(name)}\b(?!-)", steps), name
