"""Third-party engines: an installed plugin (`gate.engines` entry point) gated by name,
`module:Class` loading, and the "did you mean" answer to a misspelt engine name.

The example plugin (tests/plugin_example, `gate-echo-engine`) is pip-installed offline
into a temporary folder put on sys.path, never into the shared virtual environment, so
the test is repeatable and leaves nothing behind.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.fake_openai_server import write_fake_pin
from helpers.gate_cli import invoke

from gate import DISTRIBUTION, read_trace
from gate.engines import registry
from gate.errors import InputError

PLUGIN_SRC = Path(__file__).parents[1] / "plugin_example"
MODEL = "fake/model"


def plugin_source(work: Path) -> Path:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in tests/.
    return Path(shutil.copytree(PLUGIN_SRC, work / "src", ignore=shutil.ignore_patterns("build", "*.egg-info")))


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install` the example plugin into a fresh folder; returns that folder.

    `--target` ignores what is installed, so it would fetch the plugin's dependency
    (`gate-llm`) again: the dependency is resolved against this environment by
    `test_the_example_depends_on_gate_llm_alone`, and this install takes the plugin only."""
    work = tmp_path_factory.mktemp("plugin")
    site = work / "site"
    done = pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site),
               str(plugin_source(work)))  # fmt: skip
    assert done.returncode == 0, f"pip install of the example plugin failed:\n{done.stdout}\n{done.stderr}"
    assert list(site.glob("gate_echo_engine-*.dist-info/entry_points.txt")), "no entry point metadata installed"
    return site


def test_the_example_depends_on_gate_llm_alone(tmp_path: Path) -> None:
    # Resolved offline against this environment, where gate is installed as `gate-llm`:
    # installing the plugin pulls nothing else in, and a dependency on `gate` (another
    # project on the package registry) would find nothing here and fail.
    meta = tomllib.loads((PLUGIN_SRC / "pyproject.toml").read_text())
    assert meta["project"]["dependencies"] == [DISTRIBUTION]
    report = tmp_path / "report.json"
    done = pip("install", "--dry-run", "--quiet", "--no-build-isolation", "--no-index", "--report", str(report),
               str(plugin_source(tmp_path)))  # fmt: skip
    assert done.returncode == 0, f"{DISTRIBUTION} is not installed here, or the plugin needs more:\n{done.stderr}"
    assert [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]] == ["gate-echo-engine"]


def test_the_example_imports_only_the_front_doors() -> None:
    source = (PLUGIN_SRC / "gate_echo_engine" / "__init__.py").read_text()
    gate_imports = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gate":
            gate_imports.add(node.module)
        elif isinstance(node, ast.Import):
            gate_imports.update(a.name for a in node.names if a.name.split(".")[0] == "gate")
    assert gate_imports == {"gate", "gate.engine"}


@pytest.fixture
def plugin(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(plugin_site))  # also invalidates the import caches
    return plugin_site


@pytest.fixture
def pinned(tmp_path: Path) -> tuple[Path, Path]:
    """A pin for MODEL and a candidate trace that repeats the oracle's tokens exactly."""
    pins = tmp_path / "pins"
    pin_path = write_fake_pin(pins, MODEL)
    lines = pin_path.read_bytes().splitlines()
    header = orjson.loads(lines[0])
    cand_header = {"gate_trace": 1, "role": "candidate", "model": MODEL, "top_k": header["top_k"],
                   "engine": {"name": "device-runtime", "version": "7"}}  # fmt: skip
    records = []
    for raw in lines[1:]:
        rec = orjson.loads(raw)
        records.append({k: rec[k] for k in ("id", "prompt_token_ids", "token_ids", "top_logprobs", "finish_reason")})
    trace = tmp_path / "candidate.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [cand_header, *records]))
    return pins, trace


def tampered(trace: Path, prompt_index: int, position: int) -> Path:
    """The same trace with one token changed to one outside the oracle's top-k: a defect."""
    lines = trace.read_bytes().splitlines()
    rec = orjson.loads(lines[1 + prompt_index])
    rec["token_ids"][position] = 499
    rec["token_ids"] = rec["token_ids"][: position + 1]
    rec["top_logprobs"] = None
    rec["finish_reason"] = "stop"
    lines[1 + prompt_index] = orjson.dumps(rec)
    out = trace.with_name("tampered.jsonl")
    out.write_bytes(b"\n".join(lines) + b"\n")
    return out


def gate_run(pins: Path, engine: str, *opts: str) -> tuple[int, dict[str, Any], str]:
    args = ["run", "--model", MODEL, "--pins-dir", str(pins), "--engine", engine, "--format", "json"]
    for opt in opts:
        args += ["--engine-opt", opt]
    r = invoke(args)
    report = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.exit_code, report, r.stderr


def test_the_installed_plugin_is_listed_by_its_entry_point(plugin: Path) -> None:
    known = registry.available()
    assert known["echo"] == "gate_echo_engine:EchoEngine"
    assert set(registry.BUILTIN) <= set(known)
    cls = registry.resolve("echo")
    assert cls.__module__ == "gate_echo_engine"
    assert Path(sys.modules["gate_echo_engine"].__file__ or "").is_relative_to(plugin)


def test_gate_run_gates_the_plugin_by_name(plugin: Path, pinned: tuple[Path, Path]) -> None:
    pins, trace = pinned
    code, report, err = gate_run(pins, "echo", f"trace={trace}")
    assert code == 0, err
    assert report["verdict"] == "strict_pass"
    assert report["counts"]["positions_matched"] == report["counts"]["positions"] == 24
    assert report["candidate_engine"] == "echo"


def test_gate_run_fails_a_plugin_whose_tokens_differ(plugin: Path, pinned: tuple[Path, Path]) -> None:
    pins, trace = pinned
    code, report, err = gate_run(pins, "echo", f"trace={tampered(trace, 1, 2)}")
    assert code == 1, err
    assert report["verdict"] == "fail"
    (div,) = report["divergences"]
    assert (div["prompt_id"], div["position"], div["candidate_token"], div["class"]) == ("p1", 2, 499, "defect")
    # The plugin has no forced decode: what follows the divergence stays unadjudicated.
    assert report["counts"]["unadjudicated_positions"] == 3


def test_plugin_options_are_checked_by_the_plugin(plugin: Path, pinned: tuple[Path, Path]) -> None:
    pins, _ = pinned
    code, _, err = gate_run(pins, "echo")
    assert code == 2
    assert "engine 'echo' needs --engine-opt trace=FILE" in err


def test_module_colon_class_loads_an_engine_without_an_entry_point(plugin: Path, pinned: tuple[Path, Path]) -> None:
    pins, trace = pinned
    code, report, err = gate_run(pins, "gate_echo_engine:EchoEngine", f"trace={trace}")
    assert code == 0, err
    assert report["verdict"] == "strict_pass"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("no_such_module_for_gate:Engine", "cannot import no_such_module_for_gate"),
        ("gate.engines.http.openai:NoSuchEngine", "has no attribute 'NoSuchEngine'"),
    ],
)
def test_module_colon_class_errors_are_input_errors(name: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem) as info:
        registry.resolve(name)
    assert info.value.exit_code == 2


def test_a_misspelt_builtin_gets_did_you_mean() -> None:
    with pytest.raises(InputError) as info:
        registry.resolve("opnai")
    assert "Did you mean 'openai'?" in str(info.value)
    assert "Known engines:" in str(info.value)


def test_a_misspelt_plugin_gets_did_you_mean(plugin: Path, pinned: tuple[Path, Path]) -> None:
    pins, _ = pinned
    code, _, err = gate_run(pins, "ecko")
    assert code == 2
    assert "unknown engine 'ecko'. Did you mean 'echo'?" in err


def test_the_plugin_reads_its_trace_with_gates_reader(plugin: Path, pinned: tuple[Path, Path]) -> None:
    # A bad trace is the plugin's input error (exit 2), named by file and line as gate names it.
    pins, trace = pinned
    bad = trace.with_name("bad.jsonl")
    lines = trace.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace('"token_ids":[', '"token_ids":[-1,')]) + "\n")
    code, _, err = gate_run(pins, "echo", f"trace={bad}")
    assert code == 2
    assert f"{bad}:2" in err and "negative token id" in err
    assert read_trace(trace, role="candidate").header.model == MODEL


def test_goldens_check_names_a_plugins_changed_options(
    plugin: Path, pinned: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The echo plugin's info() reports no "options": `gate goldens check` names what changed
    # from the options given on the command line, which the golden's header records.
    pins, trace = pinned
    monkeypatch.chdir(trace.parent)
    common = ["--model", MODEL, "--pins-dir", str(pins), "--goldens-dir", str(tmp_path / "goldens"), "--engine", "echo"]
    r = invoke(["goldens", "record", *common, "--engine-opt", f"trace={trace.name}"])
    assert r.exit_code == 0, r.output
    moved = tampered(trace, 1, 2)
    r = invoke(["goldens", "check", *common, "--engine-opt", f"trace={moved.name}", "--format", "json"])
    assert r.exit_code == 1, r.output
    rep = json.loads(r.stdout)
    assert rep["option_changes"] == {"trace": [trace.name, moved.name]}
    assert [m["prompt_id"] for m in rep["moves"]] == ["p1"]
    r = invoke(["goldens", "check", *common, "--engine-opt", f"trace={moved.name}"])
    assert f"engine options changed since the golden: trace '{trace.name}' → '{moved.name}'" in r.stdout


def test_a_builtin_name_resolves_without_reading_the_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """gate diagnose loads its honest engine by the built-in name `hf`: reading every
    installed distribution's entry points for it cost a quarter of a prefill of the test
    checkpoint. A
    plugin cannot take a built-in's name (`available` keeps the built-in), so a built-in's
    name needs no plugin; any other name still reads them."""

    def no_plugins(**kwargs: Any) -> Any:
        raise AssertionError("entry points read for a built-in name")

    monkeypatch.setattr(registry, "entry_points", no_plugins)
    cls = registry.resolve("openai")
    assert f"{cls.__module__}:{cls.__qualname__}" == registry.BUILTIN["openai"]
    with pytest.raises(AssertionError, match="entry points read"):
        registry.resolve("echo")
