"""The diagnosis cache (gate.workflows.diagnose.cache): a second diagnosis of the same position
reads the reference and the honest band instead of loading and running two models, and finds
what the first found; an entry is never read for other weights, another context or other
settings (slow: tiny models, built and loaded here)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

PROMPT = tuple(range(40, 60))
CONTEXT = PROMPT + tuple(range(80, 92))
FROM_CACHE = "the reference and the honest band: from gate's cache (the same weights and context)"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    from helpers.tiny_models import build_tiny_llama
    from helpers.tiny_pin import one_thread

    root = tmp_path_factory.mktemp("diagnose-cache-models")
    with one_thread():
        yield (
            build_tiny_llama(root / "a", seed=5, lm_head_scale=20.0),
            build_tiny_llama(root / "b", seed=6, lm_head_scale=20.0),
        )


def target(context: tuple[int, ...] = CONTEXT, path: str = "decode") -> Any:
    from gate.workflows.diagnose.core import Target

    return Target("p", len(context) - len(PROMPT), "given", path, PROMPT, context)


def diagnosed(engine: Any, model: Path, t: Any = None, *, cache: bool = True, **kw: Any) -> Any:
    from gate.workflows.diagnose.core import capturer_for, diagnose_candidate

    t = t or target()
    return diagnose_candidate(capturer_for(engine), {"name": "c"}, t, str(model), cache=cache, **kw)


def rows(d: Any) -> list[tuple[str, float, float, int]]:
    return [
        (e.module, e.error, e.honest_band, e.position)
        for f in (d.finding, d.other)
        for e in (f.layers if f is not None else ())
    ]


def test_a_second_diagnosis_reads_the_cache_loads_nothing_and_finds_the_same(
    models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.planted_engines import AttentionBug

    from gate.engines.hf.engine import HFEngine
    from gate.workflows.diagnose import core as diagnose

    monkeypatch.setenv("GATE_DIAGNOSE_CACHE_DIR", str(tmp_path))
    a = models[0]
    uncached = diagnosed(HFEngine(str(a)), a, cache=False)
    bug_uncached = diagnosed(AttentionBug(str(a), layer="1"), a, cache=False)
    first = diagnosed(HFEngine(str(a)), a)
    assert FROM_CACHE not in first.notes and len(list(tmp_path.iterdir())) == 1

    def no_load(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the reference and the honest engine were loaded on a cache hit")

    monkeypatch.setattr(diagnose, "load_hf", no_load)
    second = diagnosed(HFEngine(str(a)), a)
    assert FROM_CACHE in second.notes
    assert rows(second) == rows(first) == rows(uncached)
    assert second.finding.first is None and second.exit_code == 0  # the honest engine: nowhere
    assert second.engines == first.engines
    # The cache holds no candidate: a planted bug diagnosed from it is located where it is.
    bug = diagnosed(AttentionBug(str(a), layer="1"), a)
    assert FROM_CACHE in bug.notes
    assert bug.finding.first is not None and (bug.finding.first.layer, bug.finding.first.part) == (1, "attention")
    assert rows(bug) == rows(bug_uncached)


def test_an_entry_is_never_read_for_other_weights_even_put_in_their_place(
    models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gate.workflows.diagnose import cache as diagnose_cache

    monkeypatch.setenv("GATE_DIAGNOSE_CACHE_DIR", str(tmp_path))
    a, b = models
    from gate.engines.hf.engine import HFEngine

    diagnosed(HFEngine(str(a)), a)
    rows_from = len(CONTEXT) - 2  # lm_head from the decode path's last prompt position
    key_a = diagnose_cache.manifest(str(a), "bfloat16", PROMPT, CONTEXT, ["decode", "prefill"], CONTEXT[:-1], rows_from)
    key_b = diagnose_cache.manifest(str(b), "bfloat16", PROMPT, CONTEXT, ["decode", "prefill"], CONTEXT[:-1], rows_from)
    assert key_a is not None and key_b is not None and key_a != key_b
    assert diagnose_cache.read(key_a) is not None and diagnose_cache.read(key_b) is None
    # Model a's entry copied where model b's would lie: its manifest names a's files, so it is no entry of b's.
    shutil.copytree(diagnose_cache.entry_dir(key_a), diagnose_cache.entry_dir(key_b))
    assert diagnose_cache.read(key_b) is None
    d = diagnosed(HFEngine(str(b)), b)
    assert FROM_CACHE not in d.notes
    assert rows(d) == rows(diagnosed(HFEngine(str(b)), b, cache=False))


def test_any_change_of_an_input_is_another_entry(
    models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from gate.workflows.diagnose import cache as diagnose_cache

    monkeypatch.setenv("GATE_DIAGNOSE_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "model"
    shutil.copytree(models[0], folder)
    paths = ["decode", "prefill"]
    key = diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths)
    assert key is not None
    changed = {
        "context": diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, (*CONTEXT, 7), paths),
        "prompt": diagnose_cache.manifest(str(folder), "bfloat16", PROMPT[:-1], CONTEXT, paths),
        "honest dtype": diagnose_cache.manifest(str(folder), "float16", PROMPT, CONTEXT, paths),
        "paths": diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, ["prefill"]),
        "decode steps": diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths, CONTEXT[:-1]),
        "lm_head rows": diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths, None, 3),
    }
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        changed["threads"] = diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths)
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    changed["isa"] = diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    config = folder / "config.json"
    config.write_bytes(config.read_bytes() + b" ")
    changed["a model file's bytes"] = diagnose_cache.manifest(str(folder), "bfloat16", PROMPT, CONTEXT, paths)
    for what, other in changed.items():
        assert other is not None and other != key, what
        assert diagnose_cache.entry_dir(other) != diagnose_cache.entry_dir(key), what
    assert diagnose_cache.manifest("HuggingFaceTB/not-a-local-folder", "bfloat16", PROMPT, CONTEXT, paths) is None


def test_an_unreadable_entry_is_a_miss_and_is_computed_again(
    models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gate.engines.hf.engine import HFEngine
    from gate.workflows.diagnose import cache as diagnose_cache

    monkeypatch.setenv("GATE_DIAGNOSE_CACHE_DIR", str(tmp_path))
    a = models[0]
    first = diagnosed(HFEngine(str(a)), a)
    paths = ["decode", "prefill"]
    key = diagnose_cache.manifest(str(a), "bfloat16", PROMPT, CONTEXT, paths, CONTEXT[:-1], len(CONTEXT) - 2)
    assert key is not None
    (diagnose_cache.entry_dir(key) / diagnose_cache.REFERENCE).write_bytes(b"not an npz")
    again = diagnosed(HFEngine(str(a)), a)
    assert FROM_CACHE not in again.notes and rows(again) == rows(first)
    assert FROM_CACHE in diagnosed(HFEngine(str(a)), a).notes  # written back whole
