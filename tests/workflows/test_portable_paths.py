"""No header names the recording machine's folders.

Pins, candidate traces and goldens are committed and shared: a path in their headers is
said relative to gate's cache (`$GATE_CACHE/models/...`), the working folder or gate's
checkout, or the home folder (`~/...`), and a path anywhere else by its last name only
(`.../name`). Never `/home/alice/...`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake
from hypothesis import given
from hypothesis import strategies as st

from gate.core.storage.files import CACHE_MARK, HOME_MARK, local_places, portable, portable_path


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def header_of(path: Path) -> dict[str, Any]:
    return dict(orjson.loads(path.read_bytes().split(b"\n", 1)[0]))


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A home folder (gate's cache in it, as by default) and a working folder outside it."""
    home = tmp_path / "home" / "alice"
    work = tmp_path / "work"
    for folder in (home, work):
        folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GATE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(work)
    register_fake(monkeypatch)
    return {"root": tmp_path, "home": home, "work": work, "pins": tmp_path / "pins", "goldens": tmp_path / "goldens"}


def assert_no_local_path(header: dict[str, Any], m: dict[str, Path]) -> None:
    text = orjson.dumps(header).decode()
    assert str(m["root"]) not in text, text
    absolute = [s for s in strings(header) if os.path.isabs(s)]
    assert not absolute, absolute


def test_pin_run_and_golden_headers_name_no_folder_of_this_machine(machine: dict[str, Path]) -> None:
    m = machine
    folder = record_toy_pin(m["pins"])
    pin = header_of(folder / "pin.jsonl")
    assert_no_local_path(pin, m)
    assert pin["engine"]["model_path"] == "$GATE_CACHE/models/toy--model"

    common = ["--model", TOY_MODEL, "--pins-dir", str(m["pins"]), "--engine", "fake"]
    r = invoke(["run", *common, "--save-trace", str(m["work"] / "cand.jsonl"), "--format", "json"])
    assert r.exit_code == 0, r.output
    cand = header_of(m["work"] / "cand.jsonl")
    assert_no_local_path(cand, m)
    assert cand["engine"]["model_path"] == "$GATE_CACHE/models/toy--model"

    # Weights in a folder of one's own (--model-path): under home, `~/...`.
    weights = m["home"] / "models" / "toy"
    weights.mkdir(parents=True)  # --model-path names a folder that exists
    r = invoke(["run", *common, "--model-path", str(weights), "--save-trace", str(m["work"] / "own.jsonl")])
    assert r.exit_code == 0, r.output
    own = header_of(m["work"] / "own.jsonl")
    assert_no_local_path(own, m)
    assert own["engine"]["model"] == own["engine"]["model_path"] == "~/models/toy"

    # A golden, with an engine option that names a file: the option as given, made portable.
    r = invoke(
        ["goldens", "record", *common, "--goldens-dir", str(m["goldens"]), "--model-path", str(weights),
         "--engine-opt", f"fault_prompt={m['home'] / 'notes.txt'}"]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    golden = header_of(m["goldens"] / "toy" / "model" / "fake.jsonl")
    assert_no_local_path(golden, m)
    assert golden["engine"]["model"] == "~/models/toy"
    assert golden["engine_options"] == {"fault_prompt": "~/notes.txt"}
    assert golden["pin"]["path"] == ".../toy/model/pin.jsonl"


# --------------------------------------------------------------------------- the rule

PLACES = (
    (Path("/home/alice/.cache/gate"), CACHE_MARK),
    (Path("/srv/project"), ""),
    (Path("/home/alice"), HOME_MARK),
)


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/home/alice/.cache/gate/models/SmolLM2-135M-Instruct-bf16", "$GATE_CACHE/models/SmolLM2-135M-Instruct-bf16"),
        ("/home/alice/.cache/gate", "$GATE_CACHE"),
        ("/srv/project/oracle_pins/org/m/pin.jsonl", "oracle_pins/org/m/pin.jsonl"),
        ("/srv/project", "."),
        ("/home/alice/models/llama", "~/models/llama"),
        ("/home/alice/../alice/models/x", "~/models/x"),
        ("/home/alice", "~"),
        ("/home/alicex/m", ".../m"),  # not under /home/alice: a prefix of the name is no folder
        ("/data/weights/llama-3", ".../llama-3"),
        ("/", "..."),
        ("models/llama", "models/llama"),  # relative: as given
        ("org/model", "org/model"),
        ("", ""),
    ],
)
def test_a_path_is_said_without_the_machines_folders(path: str, said: str) -> None:
    assert portable_path(path, PLACES) == said


def test_a_path_elsewhere_may_keep_more_than_its_name() -> None:
    assert portable_path("/data/pins/org/m/pin.jsonl", PLACES, tail=3) == ".../org/m/pin.jsonl"
    assert portable_path("/m/pin.jsonl", PLACES, tail=3) == ".../m/pin.jsonl"
    assert portable_path("/home/alice/pins/org/m/pin.jsonl", PLACES, tail=3) == "~/pins/org/m/pin.jsonl"


def test_a_report_keeps_a_path_elsewhere_whole() -> None:
    assert portable_path("/data/weights/llama-3", PLACES, elide=False) == "/data/weights/llama-3"
    assert portable_path("/home/alice/m", PLACES, elide=False) == "~/m"


def test_portable_rewrites_every_path_in_a_header_value_and_nothing_else() -> None:
    info = {
        "name": "hf",
        "model": "/home/alice/w",
        "options": {"gguf": "/data/x.gguf", "threads": 2, "tie_break": "lowest", "flag": True},
        "files": ["/home/alice/.cache/gate/a", "b/c", None],
        "pair": ("/srv/project/x", 1.5),
        "url": "http://localhost:8000/v1",
        "text": "weights from /home/alice/w",  # a sentence, not a path: left alone
    }
    assert portable(info, PLACES) == {
        "name": "hf",
        "model": "~/w",
        "options": {"gguf": ".../x.gguf", "threads": 2, "tie_break": "lowest", "flag": True},
        "files": ["$GATE_CACHE/a", "b/c", None],
        "pair": ("x", 1.5),
        "url": "http://localhost:8000/v1",
        "text": "weights from /home/alice/w",
    }


NAMES = ["home", "alice", ".cache", "gate", "..", ".", "srv", "project", "x", "é"]


@given(st.lists(st.sampled_from(NAMES), max_size=8))
def test_no_absolute_path_survives(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    assert not os.path.isabs(portable_path(path, PLACES))
    assert not os.path.isabs(portable_path(path))  # this machine's own places


def test_this_machines_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    assert portable_path(tmp_path / "cache" / "models" / "m") == "$GATE_CACHE/models/m"
    assert portable_path(home / "m", local_places(cwd=tmp_path / "work")) == "~/m"
    assert portable_path(tmp_path / "work" / "m", local_places(cwd=tmp_path / "work")) == "m"
    # A working folder that holds the home folder (`/`, `/home`) is no place: it would keep
    # the layout (`home/alice/...`).
    assert portable_path(home / "m", local_places(cwd=tmp_path)) == "~/m"
    assert portable_path(tmp_path / "elsewhere", local_places(cwd=Path("/"))) == ".../elsewhere"
    # A symbolic link into the cache is said by where it leads.
    (tmp_path / "cache").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "cache")
    assert portable_path(tmp_path / "link" / "m") == "$GATE_CACHE/m"


# --------------------------------------------------------------------------- the real engine (slow)


@pytest.mark.slow
def test_the_hf_engines_headers_name_no_folder_of_this_machine(machine: dict[str, Path]) -> None:
    """The HF engine reports its weights folder (`model_path`, and `model` with
    --model-path): a pin it records, its candidate trace and its golden say `~/models/tiny`."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import build_tiny_llama

    m = machine
    weights = build_tiny_llama(m["home"] / "models" / "tiny", tie_rows=True)
    folder = m["pins"] / "tiny" / "llama"
    folder.mkdir(parents=True)
    (folder / "suite.jsonl").write_text('{"id": "a", "text": "import numpy as np", "max_tokens": 4}\n')
    (folder / "oracle.json").write_text('{"engine": "hf", "dtype": "bfloat16", "top_k": 5}')
    common = ["--model", "tiny/llama", "--model-path", str(weights), "--pins-dir", str(m["pins"])]
    r = invoke(["pin", "record", *common])
    assert r.exit_code == 0, r.output
    r = invoke(["run", *common, "--engine", "hf", "--save-trace", str(m["work"] / "cand.jsonl")])
    assert r.exit_code == 0, r.output
    r = invoke(["goldens", "record", *common, "--engine", "hf", "--goldens-dir", str(m["goldens"])])
    assert r.exit_code == 0, r.output
    pin = header_of(folder / "pin.jsonl")
    cand = header_of(m["work"] / "cand.jsonl")
    golden = header_of(m["goldens"] / "tiny" / "llama" / "hf.jsonl")
    for header in (pin, cand, golden):
        assert_no_local_path(header, m)
    assert pin["engine"]["model_path"] == cand["engine"]["model_path"] == "~/models/tiny"
    assert golden["engine"]["model"] == "~/models/tiny" and "model_path" not in golden["engine"]


def test_a_merged_trace_names_its_shards_without_this_machines_folders(machine: dict[str, Path]) -> None:
    from gate.core.pins.pin import load_pin
    from gate.core.traces.shards import merge_traces
    from gate.core.traces.trace import Trace

    m = machine
    record_toy_pin(m["pins"])
    pin_trace = load_pin(TOY_MODEL, m["pins"]).trace
    ids = [r.id for r in pin_trace.records]
    cand = Trace(header=pin_trace.header, records=pin_trace.records, path=str(m["home"] / "ci" / "shard1.jsonl"))
    merged = merge_traces([cand], ids)
    assert [o["path"] for o in merged.header.extra["merged_from"]] == ["~/ci/shard1.jsonl"]


# --------------------------------------------------------------------------- the committed files

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_committed_pins_and_goldens_name_no_folder_of_a_machine() -> None:
    files = [*REPO.glob("oracle_pins/**/pin.jsonl"), *REPO.glob("goldens/**/*.jsonl")]
    assert len(files) >= 2
    for path in files:
        absolute = [s for s in strings(header_of(path)) if os.path.isabs(s)]
        assert not absolute, (path, absolute)
    pin_file = REPO / "oracle_pins" / DEFAULT / "pin.jsonl"
    assert header_of(pin_file)["engine"]["model_path"] == "$GATE_CACHE/models/SmolLM2-135M-Instruct-bf16"
    # The committed golden was taken against the committed pin, byte for byte.
    golden = header_of(REPO / "goldens" / DEFAULT / "hf.jsonl")
    assert golden["pin"]["sha256"] == hashlib.sha256(pin_file.read_bytes()).hexdigest()
