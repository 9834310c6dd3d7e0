"""scripts/layers.py, the project's own layer check: it finds each kind of fault in a made-up
package, and the repository itself has none."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layers_script", ROOT / "scripts" / "layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_repository_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert layers().main(["--root", str(ROOT)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("layers: 0 findings in ")


def test_each_kind_of_fault_is_found(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "gate/__init__.py": "from gate.core import a\n",  # the front door may import anything below
            "gate/version.py": "",
            "gate/core/__init__.py": "",
            "gate/core/a.py": "from gate.core import b\n",
            "gate/core/b.py": "from . import a\n",  # a cycle, through a relative import
            "gate/core/c.py": "import gate.cli.main\n",  # the core importing the CLI
            "gate/core/d.py": "from gate import version\nfrom gate import c\n",  # base: fine; the front door: not
            "gate/cli/__init__.py": "",
            "gate/cli/main.py": "x = 1\n" * 7,  # too long at --max-lines 5
            "gate/core/trace.py": "y = 2\n" * 7,  # too long too: no module is exempt
            "gate/workflows/__init__.py": "",
            "gate/workflows/w.py": "import gate.engines.registry\n",  # down, through the registry: fine
            "gate/workflows/x.py": (  # a concrete backend, at the top, lazily and by name: never
                "import gate.engines.hf.e\n"
                "def f():\n    from gate.engines import vllm\n"
                "SOURCES = ('gate.engines.hf.e', 'gate.engines.registry', 'a gate.engines.hf word')\n"
            ),
            "gate/reports/__init__.py": "",
            "gate/reports/r.py": "from gate.workflows import w\n",  # a sibling floor
            "gate/engines/__init__.py": "",
            "gate/engines/_common.py": "import gate.engines.vllm.e\n",  # shared code reaching a backend
            "gate/engines/hf/__init__.py": "",
            "gate/engines/hf/e.py": "import gate.engines.vllm.e\nfrom gate.engines import _common\n",
            "gate/engines/vllm/__init__.py": "",
            "gate/engines/vllm/e.py": "from gate.core import a\n",
            "gate/engines/registry.py": "",
            "gate/stray.py": "",  # on no floor
        },
    )
    found, count = layers().findings(tmp_path, 5)
    assert count == 23
    assert found == [
        "import cycle: gate.core.a <-> gate.core.b",
        "upward import: gate.core.c (core) -> gate.cli.main (cli)",
        "upward import: gate.core.d (core) -> gate (python api)",
        "shared engine module imports another backend: gate.engines._common -> gate.engines.vllm.e",
        "backend gate.engines.hf imports another backend: gate.engines.hf.e -> gate.engines.vllm.e",
        "sideways import: gate.reports.r (reports) -> gate.workflows (workflows)",
        "sideways import: gate.reports.r (reports) -> gate.workflows.w (workflows)",
        "module on no floor: gate.stray (scripts/layers.py FLOORS)",
        "workflow reaches an engine backend: gate.workflows.x imports gate.engines.hf.e (use the registry)",
        "workflow reaches an engine backend: gate.workflows.x imports gate.engines.vllm (use the registry)",
        "workflow names an engine backend: gate.workflows.x names 'gate.engines.hf.e' (use the registry)",
        "long module: gate/cli/main.py (7 lines)",
        "long module: gate/core/trace.py (7 lines)",
    ]


def test_a_deep_chain_needs_no_recursion(tmp_path: Path) -> None:
    n = 3000
    files = {"gate/__init__.py": "", "gate/core/__init__.py": ""}
    files.update({f"gate/core/m{i}.py": f"import gate.core.m{i + 1}\n" for i in range(n)})
    files[f"gate/core/m{n}.py"] = "import gate.core.m0\n"
    write(tmp_path, files)
    found, _ = layers().findings(tmp_path, 500)
    assert len(found) == 1 and found[0].startswith("import cycle: gate.core.m0 <-> gate.core.m1 <-> ")


def test_outside_a_repository_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert layers().main(["--root", str(tmp_path)]) == 2
    assert "no gate/ package" in capsys.readouterr().err
