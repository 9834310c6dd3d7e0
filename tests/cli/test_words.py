"""The words gate prints: its help (every built-in engine, arguments by their metavars,
on/off options as flags), its piped reports (as wide as `COLUMNS`, no line ending in
spaces in any format), the last line of a run failing two ways (both named), the summary's
`strict N/N` explained, the near-tie sentence one unit to a clause, and the README
defining its unit where it first uses it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers.failing_run import failing_pair
from helpers.gate_cli import invoke
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE
from typer.main import get_command
from typer.testing import CliRunner

from gate.cli.main import app
from gate.engines.registry import BUILTIN
from gate.reports import formats

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[str]:
    """Every leaf command's path (`gate goldens check`)."""
    out: list[str] = []

    def walk(cmd: Any, path: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")
        else:
            out.append(path)

    walk(get_command(app), "gate")
    return out


def raw_help(path: str, columns: int = 300) -> str:
    r = CliRunner().invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, (path, r.output)
    return r.stdout


def test_run_help_lists_every_built_in_engine() -> None:
    text = " ".join(raw_help("gate run").split())
    engine_help = text.split("--engine", 1)[1].split("--engine-opt", 1)[0]
    assert [name for name in BUILTIN if name not in engine_help] == []


def test_usage_lines_name_arguments_by_their_metavars() -> None:
    usage = {path: raw_help(path).strip().splitlines()[0].strip() for path in commands()}
    assert usage["gate compare"] == "Usage: gate compare [OPTIONS] ORACLE CANDIDATE"
    assert usage["gate diff"] == "Usage: gate diff [OPTIONS] BASE NEW"
    assert usage["gate calibrate"] == "Usage: gate calibrate [OPTIONS] [ORACLE] [CANDIDATE]"
    assert usage["gate merge"] == "Usage: gate merge [OPTIONS] SHARDS..."
    assert [line for line in usage.values() if "{" in line] == []


def test_on_off_options_show_as_flags_not_as_values() -> None:
    for path in ["gate", "gate pin", "gate goldens", *commands()]:
        text = raw_help(path)
        assert "<bool>" not in text, path
    assert re.search(r"--floor\s+--no-floor\s+Measure", raw_help("gate pin record")), raw_help("gate pin record")


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return failing_pair(tmp_path_factory.mktemp("failing"))


@pytest.mark.parametrize("columns", [72, 100, 160])
def test_piped_reports_are_as_wide_as_columns(failing: tuple[Path, Path], columns: int) -> None:
    r = invoke(["compare", str(failing[0]), str(failing[1]), "--details"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 1, r.output
    widths = [len(line) for line in r.stdout.splitlines()]
    assert max(widths) <= columns, max(widths)
    assert max(widths) >= columns - 8, max(widths)  # panels and tables use the width given


def test_piped_reports_without_columns_keep_100(failing: tuple[Path, Path]) -> None:
    r = invoke(["compare", str(failing[0]), str(failing[1])], env={"COLUMNS": ""})
    assert max(len(line) for line in r.stdout.splitlines()) == 100


def gate_reports(failing: tuple[Path, Path], tmp_path: Path) -> dict[str, str]:
    """Every format of the gate's report and of the diff's, for a failing run and a seed pass."""
    out: dict[str, str] = {}
    for name, (oracle, cand) in {"failing": failing, "seed": (SEED_ORACLE, SEED_CANDIDATE)}.items():
        for fmt in formats("GateResult"):
            for details in ([], ["--details"]):
                r = invoke(["compare", str(oracle), str(cand), "--format", fmt, *details])
                assert r.exit_code in (0, 1), r.output
                out[f"{name} {fmt} {details}"] = r.stdout
        (tmp_path / f"{name}.json").write_text(out[f"{name} json []"])
    for fmt in formats("ReportDiff"):
        r = invoke(["diff", str(tmp_path / "failing.json"), str(tmp_path / "failing.json"), "--format", fmt])
        assert r.exit_code == 0, r.output
        out[f"diff {fmt}"] = r.stdout
    return out


def test_no_report_line_ends_in_spaces_in_any_format(failing: tuple[Path, Path], tmp_path: Path) -> None:
    for name, text in gate_reports(failing, tmp_path).items():
        ending = [n for n, line in enumerate(text.splitlines(), 1) if line != line.rstrip()]
        assert ending == [], (name, ending[:5])


def test_a_run_failing_by_defects_and_by_its_distribution_names_both_last(failing: tuple[Path, Path]) -> None:
    for fmt in ("rich", "markdown"):
        r = invoke(["compare", str(failing[0]), str(failing[1]), "--format", fmt])
        assert r.exit_code == 1, r.output
        last = next(line for line in reversed(r.stdout.splitlines()) if "verdict: fail" in line)
        assert "4 defects" in last and "numerics beyond honest drift" in last, last


def test_the_summary_says_what_strict_n_of_n_counts() -> None:
    r = invoke(["compare", str(SEED_ORACLE), str(SEED_CANDIDATE)], env={"COLUMNS": "200"})
    lines = r.stdout.splitlines()
    assert lines[-2].startswith("6/7 prompts strict 16/16, 108/112 positions")
    assert lines[-3] == (
        "(strict 16/16: every prompt has 16 oracle positions, and a strict prompt matches the oracle's tokens at "
        "all 16 of them)"
    )


def test_the_near_tie_sentence_puts_one_unit_in_each_clause(failing: tuple[Path, Path]) -> None:
    r = invoke(["compare", str(failing[0]), str(failing[1]), "--details"], env={"COLUMNS": "1000"})
    lines = r.stdout.splitlines()
    by_how_much = next(line for line in lines if line.startswith("By how much"))
    near = next(line for line in lines if line.startswith("A near tie is"))
    for sentence in (by_how_much, near):
        for group in re.findall(r"\(([^()]*)\)", sentence):
            units = [u for u in ("mnats", "grid step", "units", "nat ") if u in group]
            assert len(units) <= 1, (group, sentence)
    assert "mnats" in near and "steps of the bfloat16 grid" in near and "evidence rule" in near


def test_the_readme_defines_mnats_where_it_first_uses_it() -> None:
    text = (ROOT / "README.md").read_text()
    first = text.index("mnats")
    paragraph_start = text.rfind("\n\n", 0, first)
    paragraph_end = text.find("\n\n", first)
    paragraph = text[paragraph_start:paragraph_end]
    assert "millinats" in paragraph and "1 nat = 1000 mnats" in paragraph.replace(",", ""), paragraph


def test_the_readme_says_what_strict_n_of_n_counts() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "strict 16/16" in text
    after = text[text.index("strict 16/16") :]
    assert "all 16 of" in after[:1500], after[:1500]
