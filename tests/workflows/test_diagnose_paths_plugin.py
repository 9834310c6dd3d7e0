"""A plugin written against `gate.engine` alone (tests/helpers/paths_plugin.py: transformers with
a KV cache, `force`, `capture_path`) is gated and diagnosed on both paths like a built-in engine:
a decode-only bug (the newest KV entry dropped) that a prefill-only capture cannot see is
located on the decode path from a failed gate run, and the diagnosis carries the gate's failure;
an MLP scaled by 1.02 in every layer fails the gate by its distribution alone (against a pin with
an honest floor) while no point passes the location threshold: the run's hint says the failure
is diffuse and what to run, and the diagnosis says what failed and ranks where it grows."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

pytestmark = pytest.mark.slow

PLUGIN = "helpers.paths_plugin:PathsPluginEngine"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path_factory.mktemp("paths-plugin"))
        yield ["--model", MODEL, "--model-path", str(weights), "--pins-dir", str(pins), "--engine", PLUGIN]


def test_the_honest_plugin_passes_the_gate(tiny: list[str]) -> None:
    r = invoke(["run", *tiny, "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert orjson.loads(r.stdout)["verdict"] == "strict_pass"


def test_a_decode_only_bug_fails_the_gate_and_is_located_on_the_decode_path(tiny: list[str]) -> None:
    bug = [*tiny, "--engine-opt", "bug=drop_newest_kv"]
    run = invoke(["run", *bug, "--format", "json"])
    assert run.exit_code == 1, run.stderr
    assert orjson.loads(run.stdout)["counts"]["defects"] > 0
    assert "gate diagnose --model" in run.stderr and "first defect" in run.stderr
    r = invoke(["diagnose", *bug, "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert (d["path"], d["first_divergent_part"]) == ("decode", "attention"), d["summary"]
    assert "only the decode path shows it" in d["summary"]
    assert d["other_path"]["first_divergent_layer"] is None  # the prefill path is clean
    assert d["gate_failure"]["chosen"] == "its first defect" and d["gate_failure"]["path"] == "decode"
    assert d["excursions"][0]["path"] == "decode"


# The tiny pin's own honest plugin run measures KL 0 (it is the oracle's arithmetic): a floor
# of 0.2 mnats x 2 fails an MLP scaled by 1.02 (mean KL about 0.7) and passes the honest one.
FLOOR = {"kl_mean_mnats": 0.2, "kl_p99_mnats": 5.0, "same_top_rate": 0.9, "margin": 2.0, "measured_by": "a test"}


@pytest.fixture(scope="module")
def floored(tiny: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The tiny pin with an honest floor in its doctrine (the distribution verdict judged)."""
    from helpers.tiny_pin import MODEL

    pins = tmp_path_factory.mktemp("floored") / "pins"
    shutil.copytree(Path(tiny[tiny.index("--pins-dir") + 1]), pins)
    pin = pins / MODEL / "pin.jsonl"
    lines = pin.read_bytes().splitlines()
    head = json.loads(lines[0])
    head.setdefault("doctrine", {})["floor"] = FLOOR
    pin.write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:]]) + b"\n")
    args = list(tiny)
    args[args.index("--pins-dir") + 1] = str(pins)
    return args


def test_a_diffuse_failure_is_said_to_be_one_by_the_run_and_ranked_by_the_diagnosis(floored: list[str]) -> None:
    honest = invoke(["run", *floored, "--format", "json"])
    assert honest.exit_code == 0, honest.stderr
    scaled = [*floored, "--engine-opt", "bug=mlp_scale", "--engine-opt", "scale=1.02"]
    run = invoke(["run", *scaled, "--format", "json"])
    assert run.exit_code == 1, run.stderr
    report = orjson.loads(run.stdout)
    assert report["counts"]["defects"] == 0 and report["distribution"]["beyond"], report["distribution"]
    assert "the failure is diffuse" in run.stderr and "gate diagnose --model" in run.stderr
    assert "--prompt" not in run.stderr.split("the failure is diffuse")[1]
    r = invoke(["diagnose", *scaled, "--format", "json"])
    assert r.exit_code == 0, r.stderr  # nothing passes the threshold: the rule's own exit code
    d = orjson.loads(r.stdout)
    assert d["source"] == "distribution" and d["gate_failure"]["reasons"][0].startswith(
        "its distribution is beyond the honest floor: mean KL"
    )
    assert d["summary"].startswith("the gate failed (its distribution is beyond the honest floor")
    assert "a diffuse failure, through the decode path" in d["summary"]
    assert "nothing leaves the honest band" not in d["summary"]
    ranked = d["excursions"]
    assert len(ranked) == 5 and ranked[0]["part"] == "mlp" and 1.0 < ranked[0]["ratio"] <= 4.0
    assert [e["ratio"] for e in ranked] == sorted((e["ratio"] for e in ranked), reverse=True)
    text = invoke(["diagnose", *scaled])
    assert "largest excursions, both paths (past the margin or not):" in text.stdout
