"""The two front doors name exactly what they promise: `import gate` (the Python API) and
`gate.engine` (the plugin contract). A name added or lost here is a change to what users and
plugin authors import, so it is pinned; internal modules may move freely behind them."""

from __future__ import annotations

import inspect
import subprocess
import sys

import gate
import gate.engine

PYTHON_API = {
    "DISTRIBUTION", "__version__", "install_line",
    "compare", "read_trace", "write_trace", "Trace", "TraceHeader", "PromptRecord",
    "load_pin", "load_engine", "run", "Pin", "Doctrine", "Evidence", "Floor",
    "GateResult", "PromptResult", "Divergence", "Engine", "PromptInput", "render",
    "GateError", "InputError", "TraceError", "PinError", "EngineError", "Interrupted",
}  # fmt: skip
PLUGIN_CONTRACT = {
    "Engine", "PromptInput", "PromptRecord", "ForcedDecode", "ForcedDecodeUnavailable", "EngineError",
    "InputError", "parse_options", "SCHEDULE_KNOBS",
    "ForcesDecode", "HasScheduleKnobs", "BatchesPrompts", "KeepsRequestsInFlight", "ReplaysRouting",
    "CapturesActivations", "ReportsPrefixReuse",
    "CapturesPaths", "Capture", "PREFILL", "DECODE", "model_folder",
}  # fmt: skip


def test_the_python_api_exports_exactly_its_names() -> None:
    assert set(gate.__all__) == PYTHON_API
    assert len(gate.__all__) == len(PYTHON_API)
    assert set(dir(gate)) == PYTHON_API


def test_every_python_api_name_resolves() -> None:
    for name in PYTHON_API:
        assert getattr(gate, name) is not None, name
    assert gate.DISTRIBUTION == "gate-llm"
    assert gate.install_line("hf") == "pip install 'gate-llm[hf]'"
    for error in ("InputError", "TraceError", "PinError", "EngineError", "Interrupted"):
        assert issubclass(getattr(gate, error), gate.GateError)
    assert list(inspect.signature(gate.compare).parameters) == ["oracle", "candidate", "doctrine"]
    assert list(inspect.signature(gate.load_pin).parameters) == ["model", "pins_dir"]
    assert list(inspect.signature(gate.load_engine).parameters) == ["name", "model", "options"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        gate.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("gate.no_such_name resolved")


def test_the_plugin_contract_exports_exactly_its_names() -> None:
    assert set(gate.engine.__all__) == PLUGIN_CONTRACT
    assert len(gate.engine.__all__) == len(PLUGIN_CONTRACT)
    for name in PLUGIN_CONTRACT:
        assert getattr(gate.engine, name) is not None, name
    assert gate.engine.PromptRecord is gate.PromptRecord
    assert gate.engine.Engine is gate.Engine


def test_the_front_doors_load_no_engine_and_no_torch() -> None:
    code = (
        "import sys, gate, gate.engine\n"
        "[getattr(gate, n) for n in gate.__all__]\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers', 'llama_cpp')"
        " or m.startswith('gate.engines.') and m != 'gate.engines.registry')\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_user_guides_import_only_the_front_doors() -> None:
    """A guide a user copies from imports `gate` and `gate.engine` only: an internal module
    it names (`gate.engines.registry`) may move without notice."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pages = [
        "README.md",
        *(f"docs/guides/{n}" for n in ("ci.md", "plugins.md", "python-api.md")),
    ]
    internal = []
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", (root / page).read_text(), re.S):
            for module in re.findall(r"^\s*(?:from|import)\s+(gate[\w.]*)", block, re.M):
                if module not in ("gate", "gate.engine"):
                    internal.append((page, module))
    assert internal == []
