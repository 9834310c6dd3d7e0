"""Which oracle recorded a pin: `gate pin record --oracle transformers --dtype D` records with the
reference implementation; the pin says which oracle recorded it, every report names it, and a pin
folder whose oracle.json claims another oracle than the one that recorded the pin is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake, run_fake, toy_pin_folder

from gate.core.pins.oracle_settings import OracleSettings
from gate.errors import InputError
from gate.workflows.pins.record import with_oracle


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)


def test_the_reference_oracle_needs_its_dtype_chosen(tmp_path: Path) -> None:
    toy_pin_folder(tmp_path)
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--oracle", "transformers"])
    assert r.exit_code == 2, r.output
    assert "--dtype bfloat16 or --dtype float32" in r.stderr
    assert not (tmp_path / TOY_MODEL / "pin.jsonl").exists()


@pytest.mark.parametrize(("flag", "value"), [("--oracle", "sglang"), ("--dtype", "float16")])
def test_an_unknown_oracle_or_dtype_is_refused(tmp_path: Path, flag: str, value: str) -> None:
    toy_pin_folder(tmp_path)
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), flag, value])
    assert r.exit_code == 2, r.output
    assert f"{flag} {value}: expected one of" in r.stderr


def test_the_reference_oracle_drops_vllms_own_settings() -> None:
    vllm = OracleSettings(engine="vllm", dtype="bfloat16", tensor_parallel_size=2, max_model_len=4096)
    hf = with_oracle(vllm, "transformers", "float32")
    assert (hf.engine, hf.dtype, hf.tensor_parallel_size, hf.max_model_len) == ("hf", "float32", 1, None)
    assert hf.engine_kwargs() == {"dtype": "float32"}
    # An oracle.json that already names the reference oracle has chosen its dtype.
    assert with_oracle(OracleSettings(engine="hf", dtype="bfloat16"), "transformers", None).dtype == "bfloat16"
    with pytest.raises(InputError):
        with_oracle(vllm, "transformers", None)


def test_a_pin_claimed_for_another_oracle_is_refused(tmp_path: Path) -> None:
    folder = record_toy_pin(tmp_path)
    assert run_fake(tmp_path).exit_code == 0
    settings = json.loads((folder / "oracle.json").read_text())
    (folder / "oracle.json").write_text(json.dumps({**settings, "engine": "vllm"}))
    r = run_fake(tmp_path)
    assert r.exit_code == 2, r.output
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gate: error") or "recorded by" in x][:1]
    assert "recorded by the fake oracle" in line and "claims vllm" in line
    show = invoke(["pin", "show", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert show.exit_code == 2 and "recorded by the fake oracle" in show.stderr


def test_every_report_names_the_oracle_that_recorded_the_pin(tmp_path: Path) -> None:
    record_toy_pin(tmp_path)
    show = invoke(["pin", "show", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert show.exit_code == 0 and json.loads(show.stdout)["recorded_by"] == "fake"
    for fmt, needle in (("json", '"oracle_engine": "fake"'), ("markdown", "oracle fake vs candidate fake")):
        r = run_fake(tmp_path, "--format", fmt)
        assert r.exit_code == 0 and needle in r.stdout.replace('":"', '": "'), (fmt, r.stdout[-1500:])


@pytest.mark.parametrize("fmt", ["markdown", "html", "json"])
def test_a_transformers_pin_is_named_as_such_in_the_reports(tmp_path: Path, fmt: str) -> None:
    from dataclasses import replace

    from helpers.trace_builders import mixed_result

    from gate.reports import render

    result = replace(mixed_result(tmp_path), oracle_engine="hf")
    text = render(result, fmt)
    assert ("oracle transformers (hf) vs candidate" in text) if fmt != "json" else ('"oracle_engine": "hf"' in text)


def test_an_moe_oracle_that_gives_its_routers_top_k_still_writes_a_valid_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HF engine gives an MoE model's router top-k (`router_top`, a candidate's evidence);
    recording a pin with it as the oracle keeps the routed experts and leaves that out, so the
    pin reads back (the trace reader refuses `router_top` in an oracle)."""
    from dataclasses import replace

    from helpers.fake_engine import FakeEngine

    plain = FakeEngine.generate

    def with_router_top(self: FakeEngine, prompts: Any, top_k: int) -> Any:
        recs = plain(self, prompts, top_k)
        return [replace(r, router_top=[[[[0, 0.5]]] for _ in r.token_ids]) for r in recs]

    monkeypatch.setattr(FakeEngine, "generate", with_router_top)
    record_toy_pin(tmp_path)
    pin = (tmp_path / TOY_MODEL / "pin.jsonl").read_text()
    assert "router_top" not in pin
    assert run_fake(tmp_path).exit_code in (0, 1)  # the pin loads; the verdict is the toy's business
