"""The repository stands alone: it reads nothing from beside the clone, ships its own spec
page, seed example, layer check and licence, and the spec page's figures are gate's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A path out of the repository into the development machine's shared folder.
OUTSIDE = re.compile(r"\.\./shared|shared/spec/|shared/tools/|/work/")


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")  # an sdist: nothing to scan the tree by
    files = []
    for name in out.splitlines():
        path = ROOT / name
        if (
            path.is_file()
            and path != Path(__file__).resolve()
            and path.suffix in {".py", ".md", ".toml", ".sh", ".json", ".cfg", ".txt", ""}
        ):
            files.append(path)
    return files


def test_no_file_reaches_outside_the_repository() -> None:
    bad = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        bad += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert bad == []


def test_the_repository_has_its_spec_seed_example_layer_check_and_licence() -> None:
    for name in (
        "docs/spec.md",
        "docs/examples/seed-oracle.jsonl",
        "docs/examples/seed-candidate.jsonl",
        "scripts/layers.py",
        "LICENSE",
    ):
        assert (ROOT / name).is_file(), name
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence  # the full text, not a pointer to it
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject  # an SPDX expression


def test_the_spec_pages_seed_summary_is_what_gate_compare_prints() -> None:
    from helpers.gate_cli import invoke

    spec = (ROOT / "docs" / "spec.md").read_text()
    examples = ROOT / "docs" / "examples"
    r = invoke(["compare", str(examples / "seed-oracle.jsonl"), str(examples / "seed-candidate.jsonl")])
    assert r.exit_code == 0, r.output
    summary = next(line for line in r.stdout.splitlines() if line.startswith("6/7 prompts strict"))
    assert summary in spec and "verdict: ratified pass (exit 0)" in spec
