"""The `gate_check` fixture at its edges: parametrized tests each get their own report
files and a true count, a report folder that is a file is one clear message (no
traceback), and a bad input's message is printed once (no chained exception)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.pin_candidates import default_pin_trace, honest_candidate, write_trace_file

from gate.integrations.pytest_plugin import report_stem

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace_file(honest_candidate(default_pin_trace()), tmp_path_factory.mktemp("edges") / "honest.jsonl")


# Parameter ids that the old file-name rule folded onto one name, and two long ids that
# differ only past its 200-character cut.
COLLIDING = ["a b", "a/b", "a_b", "x" * 300 + "1", "x" * 300 + "2"]


def test_parametrized_tests_each_write_their_own_reports(pytester: pytest.Pytester, honest: Path) -> None:
    pytester.makepyfile(
        test_foreign=f"""
import pytest

@pytest.mark.parametrize("name", {COLLIDING!r})
def test_engine(gate_check, name):
    gate_check({str(honest)!r})
"""
    )
    r = pytester.runpytest("-p", "no:cacheprovider", "--gate-report-dir", "reports")
    r.assert_outcomes(passed=len(COLLIDING))
    files = sorted((pytester.path / "reports").iterdir())
    assert len(files) == 2 * len(COLLIDING), [f.name for f in files]
    r.stdout.fnmatch_lines([f"gate: {2 * len(COLLIDING)} report file(s) written to *"])


def test_report_stems_of_distinct_node_ids_are_distinct() -> None:
    ids = [f"test_foreign.py::test_engine[{name}]" for name in COLLIDING]
    ids += ["t.py::test_x", "t.py::test_x[1]", "t.py::test_x_1"]
    stems = [report_stem(i, 1) for i in ids]
    assert len(set(stems)) == len(stems), stems
    assert all(len(s) <= 170 for s in stems)
    assert report_stem("test_foreign.py::test_honest_engine", 1) == "test_foreign.py_test_honest_engine"


def test_two_files_whose_node_ids_fold_to_one_name_keep_both_reports(pytester: pytest.Pytester, honest: Path) -> None:
    body = f"def test_b(gate_check):\n    gate_check({str(honest)!r})\n"
    pytester.mkpydir("sub").joinpath("test_a.py").write_text(body)
    pytester.path.joinpath("sub_test_a.py").write_text(body)
    r = pytester.runpytest("-p", "no:cacheprovider", "--gate-report-dir", "reports", "sub/test_a.py", "sub_test_a.py")
    r.assert_outcomes(passed=2)
    assert len(list((pytester.path / "reports").iterdir())) == 4
    r.stdout.fnmatch_lines(["gate: 4 report file(s) written to *"])


def test_a_report_folder_that_is_a_file_is_one_clear_message(pytester: pytest.Pytester, honest: Path) -> None:
    (pytester.path / "reports").write_text("not a folder\n")
    pytester.makepyfile(test_foreign=f"def test_engine(gate_check):\n    gate_check({str(honest)!r})\n")
    r = pytester.runpytest("-p", "no:cacheprovider", "--gate-report-dir", "reports")
    out = r.stdout.str() + r.stderr.str()
    assert "--gate-report-dir" in out and "is not a folder" in out, out
    assert "Traceback" not in out and "FileExistsError" not in out, out
    assert (pytester.path / "reports").read_text() == "not a folder\n"


def test_a_missing_trace_s_message_is_printed_once(pytester: pytest.Pytester, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    pytester.makepyfile(test_foreign=f"def test_missing(gate_check):\n    gate_check({str(missing)!r})\n")
    r = pytester.runpytest("-p", "no:cacheprovider")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    failure = out.split("FAILURES")[1].split("short test summary")[0]
    assert failure.count(f"gate: error: {missing}: no such file") == 1, out
    assert "During handling of the above exception" not in out, out
