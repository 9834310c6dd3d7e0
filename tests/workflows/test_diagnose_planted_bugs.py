"""`gate diagnose` on real (tiny) models with planted bugs: each located at its layer, part and
path; honest engines located nowhere. One reference and one honest engine per model (module
fixtures); each planted engine loads in a fraction of a second."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

PROMPT = tuple(range(40, 72))  # 32 prompt tokens
CONTEXT = PROMPT + tuple(range(80, 96))  # + 16 "oracle" tokens: the position diagnosed is 16


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    from helpers.tiny_pin import one_thread

    with one_thread():
        yield


@pytest.fixture(scope="module")
def llama(tiny_models_dir: Path, threads: None) -> Iterator[tuple[Path, Any, Any]]:
    from helpers.tiny_models import build_tiny_llama

    from gate.workflows.diagnose.core import reference_engines

    path = build_tiny_llama(tiny_models_dir / "diagnose-llama", seed=5, lm_head_scale=20.0)
    with reference_engines(str(path)) as (ref, hon):
        yield path, ref, hon


@pytest.fixture(scope="module")
def moe(tiny_models_dir: Path, threads: None) -> Iterator[tuple[Path, Any, Any]]:
    from helpers.tiny_models import build_tiny_qwen3_moe

    from gate.workflows.diagnose.core import reference_engines

    path = build_tiny_qwen3_moe(tiny_models_dir / "diagnose-moe", seed=5, lm_head_scale=20.0)
    with reference_engines(str(path)) as (ref, hon):
        yield path, ref, hon


def run(setup: tuple[Path, Any, Any], engine: Any, path: str = "decode") -> Any:
    from gate.engines.hf.capture import capture_hf
    from gate.workflows.diagnose.core import Target, capturer_for, diagnose

    _, ref, hon = setup
    target = Target("p", len(CONTEXT) - len(PROMPT), "given", path, PROMPT, CONTEXT)
    return diagnose(
        target,
        capturer_for(engine),
        lambda p, c, pa: capture_hf(ref, p, c, pa),
        lambda p, c, pa: capture_hf(hon, p, c, pa),
    )


def located(d: Any) -> tuple[int | None, str | None]:
    first = d.finding.first
    return (None, None) if first is None else (first.layer, first.part)


@pytest.mark.parametrize(
    ("cls", "opts", "where"),
    [
        ("AttentionBug", {"layer": "1"}, (1, "attention")),
        ("AttentionBug", {"layer": "0"}, (0, "attention")),
        ("MLPSwapBug", {"layer": "1"}, (1, "mlp")),
        ("EmbeddingScaleBug", {}, (-1, "embedding")),
        ("WrongActivationBug", {}, (0, "mlp")),
    ],
)
def test_a_bug_on_both_paths_is_located_at_its_layer_and_part(
    llama: tuple[Path, Any, Any], cls: str, opts: dict[str, str], where: tuple[int, str]
) -> None:
    from helpers import planted_engines

    engine = getattr(planted_engines, cls)(str(llama[0]), **opts)
    d = run(llama, engine)
    assert located(d) == where, d.summary
    assert d.other is not None and d.other.first is not None
    assert (d.other.first.layer, d.other.first.part) == where  # the bug is in the weights' use: both paths
    assert d.exit_code == 1
    assert "the prefill path shows it too" in d.summary


@pytest.mark.parametrize("cls", ["DecodePositionBug", "QuantisedKVCacheBug"])
def test_a_decode_only_bug_is_located_on_the_decode_path_only(llama: tuple[Path, Any, Any], cls: str) -> None:
    from helpers import planted_engines

    d = run(llama, getattr(planted_engines, cls)(str(llama[0])))
    assert located(d) == (0, "attention"), d.summary
    assert d.finding.first is not None and d.finding.first.position >= len(PROMPT)  # a decoded position
    assert d.other is not None and d.other.path == "prefill" and d.other.first is None
    assert "only the decode path shows it" in d.summary
    # Diagnosed on the prefill path, the same engine is clean there and the decode path shows it.
    d2 = run(llama, getattr(planted_engines, cls)(str(llama[0])), path="prefill")
    assert d2.finding.first is None and d2.exit_code == 0
    assert d2.other is not None and d2.other.first is not None and "the decode path shows it" in d2.summary


def test_the_selftest_skip_layer_mutant_is_located_at_its_layer(llama: tuple[Path, Any, Any]) -> None:
    from gate.engines.hf.mutants import LayerSkippedHFEngine

    d = run(llama, LayerSkippedHFEngine(str(llama[0]), layer=1))
    assert located(d) == (1, "residual"), d.summary
    assert "model.layers.1.self_attn" in d.finding.missing  # the skipped layer's parts never ran


@pytest.mark.parametrize("opts", [{}, {"attn_implementation": "eager"}, {"threads": "2"}])
def test_honest_engines_in_process_are_located_nowhere(llama: tuple[Path, Any, Any], opts: dict[str, str]) -> None:
    import torch

    from gate.engines.hf.engine import HFEngine

    before = torch.get_num_threads()
    try:
        d = run(llama, HFEngine(str(llama[0]), **opts))
    finally:
        torch.set_num_threads(before)
    assert located(d) == (None, None), d.summary
    assert d.other is not None and d.other.first is None
    assert d.exit_code == 0


def test_moe_expert_and_router_bugs_are_located(moe: tuple[Path, Any, Any]) -> None:
    from helpers import planted_engines

    from gate.engines.hf.engine import HFEngine

    d = run(moe, planted_engines.ExpertScaleBug(str(moe[0]), layer="1", expert="0"))
    assert located(d) == (1, "experts"), d.summary
    d = run(moe, planted_engines.RouterBug(str(moe[0]), layer="1"))
    assert located(d) == (1, "router"), d.summary
    d = run(moe, HFEngine(str(moe[0]), attn_implementation="eager"))
    assert located(d) == (None, None), d.summary


def test_honest_engines_under_every_forceable_isa_path_are_located_nowhere(llama: tuple[Path, Any, Any]) -> None:
    """Each kernel-path variant in its own process (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA
    are read when torch loads), against this process's reference and band: the margin's
    premise. The variants of engine options (threads, eager attention) are the in-process
    test's; a path this process already runs (its own ATen capability) needs no second one,
    and a path this CPU lacks (AVX-512 on an AVX2-only machine) cannot run."""
    import torch

    from gate.core.diagnosis.locate import compare_path
    from gate.engines.hf.capture import capture_hf
    from gate.workflows.diagnose.variants import capture_in_subprocess, runnable_variants

    path, ref, hon = llama
    native = torch.backends.cpu.get_cpu_capability().lower()
    paths = {n: v for n, v in runnable_variants().items() if v[0] and v[0].get("ATEN_CPU_CAPABILITY") != native}
    assert len(paths) >= 2, paths  # at least the portable default and one more path is forced
    worst = {}
    for name, (env, opts) in paths.items():
        got = capture_in_subprocess(str(path), opts, env, PROMPT, CONTEXT, ("decode", "prefill"))
        for p, cand in got.items():
            f = compare_path(capture_hf(ref, PROMPT, CONTEXT, p), capture_hf(hon, PROMPT, CONTEXT, p), cand)
            assert f.first is None, (name, p, f.first)
            worst[name, p] = max(e.ratio for e in f.layers)
    assert all(r < 4.0 for r in worst.values()), worst


@pytest.mark.parametrize(
    ("avx2", "avx512", "expected"),
    [(True, True, {"aten-default", "aten-avx2", "aten-avx512"}), (True, False, {"aten-default", "aten-avx2"})],
)
def test_a_variant_forcing_instructions_the_cpu_lacks_is_not_run(
    monkeypatch: pytest.MonkeyPatch, avx2: bool, avx512: bool, expected: set[str]
) -> None:
    """torch forced to AVX-512 kernels on an AVX2-only CPU dies of SIGILL: such a variant is
    left out, every other (the oneDNN ceilings, threads, eager attention) stays."""
    import torch

    from gate.workflows.diagnose.variants import HONEST_VARIANTS, runnable_variants

    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: avx2)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    names = set(runnable_variants())
    assert {n for n in names if n.startswith("aten-")} == expected
    assert {n for n in HONEST_VARIANTS if not n.startswith("aten-")} <= names
