"""The wheel carries the pins, their suites and the goldens as package data, found with
importlib.resources from any folder; `./oracle_pins` and `--pins-dir` still come first, and
the installed package's data is never written. Builds the wheel for real (seconds, no
network: `--no-build-isolation`) and runs gate from it in an empty folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout (only its files git knows), unpacked."""
    build = tmp_path_factory.mktemp("build")
    src = build / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for name in filter(None, files):
        path = ROOT / name
        if path.is_symlink():  # gate/_data's links to the top-level data folders, as git keeps them
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).symlink_to(os.readlink(path))
        elif path.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    out = build / "wheel"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (build / "build.log").write_text(run.stdout + run.stderr)
    (whl,) = out.glob("*.whl")
    assert whl.name.startswith("gate_llm-")
    site = build / "site"
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    return site


def test_the_pins_and_goldens_have_one_home() -> None:
    """The top-level folders are the only copy: gate/_data links to them, and gate finds its
    own data through that link (no other way of telling a checkout from a wheel)."""
    from gate.core.storage import files

    for name in ("oracle_pins", "goldens"):
        link = ROOT / "gate" / "_data" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), name
        assert files.own_data_dir(name) == (ROOT / name).resolve(), name
    assert "pyproject.toml" not in Path(files.__file__).read_text()
    pin = ROOT / "oracle_pins" / MODEL / "pin.jsonl"
    assert not files.is_packaged(pin) and not files.is_packaged(ROOT / "gate" / "_data" / "oracle_pins" / MODEL)
    assert files.portable_path(pin, files.local_places(cwd=Path("/nonexistent"))) == f"oracle_pins/{MODEL}/pin.jsonl"


def test_the_build_backend_has_nothing_to_warn_about(wheel: Path) -> None:
    """Every importable folder of the pins and goldens is declared as the package it is, and
    the licence is an SPDX string: setuptools warns about neither (nothing is silenced)."""
    log = (wheel.parent / "build.log").read_text()
    assert "Warning" not in log and "deprecated" not in log, log[-3000:]


def gate_from(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_PINS_DIR", "GATE_GOLDENS_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "gate", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_wheel_holds_the_pins_suites_and_goldens(wheel: Path) -> None:
    data = wheel / "gate" / "_data"
    for rel in ("pin.jsonl", "suite.jsonl", "oracle.json"):
        committed = ROOT / "oracle_pins" / MODEL / rel
        assert (data / "oracle_pins" / MODEL / rel).read_bytes() == committed.read_bytes(), rel
    assert (data / "goldens" / MODEL / "hf.jsonl").read_bytes() == (ROOT / "goldens" / MODEL / "hf.jsonl").read_bytes()
    assert (data / "oracle_pins" / "Qwen" / "Qwen3.6-35B-A3B" / "suite.jsonl").is_file()
    assert not (wheel / "oracle_pins").exists() and not (wheel / "tests").exists()


def test_the_wheel_holds_the_qwen36_test_checkpoint_and_its_pin(wheel: Path, tmp_path: Path) -> None:
    """`gate-llm/Qwen3.6-tiny` resolves from an installed wheel: its files (checked against its
    manifest by `pin show`'s neighbours, `gate run`) and its pin folder are package data."""
    checkpoint = ROOT / "gate" / "_data" / "models" / "Qwen3.6-tiny"
    shipped = wheel / "gate" / "_data" / "models" / "Qwen3.6-tiny"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert "model.safetensors" in names and "gate-manifest.json" in names
    for name in names:
        assert (shipped / name).read_bytes() == (checkpoint / name).read_bytes(), name
    r = gate_from(wheel, tmp_path, "pin", "show", "--model", "gate-llm/Qwen3.6-tiny")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["engine"]["name"] == "hf" and shown["recorded_by"] == "transformers"


def test_pin_show_runs_from_an_empty_folder(wheel: Path, tmp_path: Path) -> None:
    r = gate_from(wheel, tmp_path, "pin", "show", "--model", MODEL)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert Path(shown["pin"]).is_relative_to(wheel / "gate" / "_data" / "oracle_pins")
    assert shown["prompts"] == 41 and shown["model"] == MODEL


def test_compare_of_the_seed_example_from_an_empty_folder(wheel: Path, tmp_path: Path) -> None:
    examples = ROOT / "docs" / "examples"
    r = gate_from(
        wheel, tmp_path, "compare", str(examples / "seed-oracle.jsonl"), str(examples / "seed-candidate.jsonl")
    )
    assert r.returncode == 0, r.stderr
    assert "verdict: ratified pass (exit 0)" in r.stdout


def test_a_local_pin_folder_comes_first(wheel: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "oracle_pins" / MODEL, tmp_path / "oracle_pins" / MODEL)
    r = gate_from(wheel, tmp_path, "pin", "show", "--model", MODEL)
    assert r.returncode == 0, r.stderr
    assert (
        Path(json.loads(r.stdout)["pin"]) == Path("oracle_pins") / MODEL / "pin.jsonl"
        or Path(json.loads(r.stdout)["pin"]).resolve() == (tmp_path / "oracle_pins" / MODEL / "pin.jsonl").resolve()
    )
    # --pins-dir names the only root: a model not under it is not found in the package.
    r = gate_from(wheel, tmp_path, "pin", "show", "--model", MODEL, "--pins-dir", str(tmp_path / "elsewhere"))
    assert r.returncode == 2 and "no pin folder" in r.stderr


def test_the_packages_own_pin_is_never_rerecorded_in_place(wheel: Path, tmp_path: Path) -> None:
    r = gate_from(wheel, tmp_path, "pin", "record", "--model", MODEL, "--force")
    assert r.returncode == 2, r.stderr
    assert "is gate's own, inside the installed package" in r.stderr
    assert f"copy that folder to ./oracle_pins/{MODEL}" in r.stderr


def test_a_path_into_the_packages_data_is_said_as_in_a_checkout(wheel: Path, tmp_path: Path) -> None:
    pin = wheel / "gate" / "_data" / "oracle_pins" / MODEL / "pin.jsonl"
    code = f"from gate.core.storage.files import portable_path; print(portable_path({str(pin)!r}))"
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(wheel)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"oracle_pins/{MODEL}/pin.jsonl"
