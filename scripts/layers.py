#!/usr/bin/env python3
"""The house's floors, checked from the imports as they are (every import statement, a
function's lazy one and a TYPE_CHECKING one included):

- every module sits on one floor, and an import between two floors points down: a floor
  imports only floors of a lower rank, never one above it or one beside it;
- no engine backend (a sub-package of gate/engines/) imports another, and the engines'
  shared modules import no backend;
- no workflow reaches an engine backend, by an import or by a module's name in a string:
  workflows reach engines through the registry and the capability protocols only;
- no import cycle among gate's modules;
- no module over the line limit, none excepted.

docs/architecture.md draws these floors. Run from the repository root:
`python3 scripts/layers.py [--max-lines 500]`. Prints one line per finding and a count;
exit 0 when there are none, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

# The floors, bottom up: (name, rank, the modules on it by name prefix). An import may point
# only to a floor of a lower rank; floors of one rank are siblings that import neither way.
FLOORS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("base", 0, ("gate.errors", "gate.text", "gate.version", "gate._data")),
    ("core", 1, ("gate.core",)),
    ("plugin contract", 3, ("gate.engine",)),
    ("models", 2, ("gate.models",)),
    ("engines", 3, ("gate.engines",)),
    ("workflows", 4, ("gate.workflows",)),
    ("reports", 4, ("gate.reports",)),
    ("cli", 5, ("gate.cli", "gate.__main__")),
    ("python api", 5, ("gate", "gate.api")),
    ("integrations", 5, ("gate.integrations",)),
)
ENGINES = "gate.engines"
WORKFLOWS = "gate.workflows"
# A string that is a module's name (`gate.engines.hf.capture`, `gate.engines.hf.engine:HFEngine`).
MODULE_NAME = re.compile(r"[A-Za-z_][\w.]*(:\w+)?")


def floor_of(name: str) -> tuple[str, int] | None:
    """The floor of module `name`: the one whose prefix matches it longest (`gate` is the
    front door's own module, not every module's)."""
    best: tuple[int, str, int] | None = None
    for floor, rank, prefixes in FLOORS:
        for prefix in prefixes:
            if (name == prefix or (prefix != "gate" and name.startswith(prefix + "."))) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), floor, rank)
    return None if best is None else (best[1], best[2])


def backend_of(name: str, packages: set[str]) -> str | None:
    """The engine backend (`gate.engines.hf`) a module belongs to, None for a shared module."""
    parts = name.split(".")
    if len(parts) >= 3 and name.startswith(ENGINES + "."):
        package = ".".join(parts[:3])
        return package if package in packages else None
    return None


def imported(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The known modules `path` (module `name`) imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                head = parts[: len(parts) - node.level + 1]
                base = ".".join([*head, base] if base else head)
            out.add(base)
            # `from pkg import mod` imports the module pkg.mod when there is one.
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m in known and m != name}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module: the import cycles.
    Iterative, so a deep import chain cannot exhaust the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def findings(root: Path, max_lines: int) -> tuple[list[str], int]:
    """Every finding for the `gate` package under `root`, and the number of modules."""
    files = module_files(root)
    known = {name: root / path for name, path in files.items()}
    graph = {name: imported(path, name, known) for name, path in known.items()}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    out = [f"import cycle: {' <-> '.join(cycle)}" for cycle in strongly_connected(graph)]
    for name in sorted(graph):
        out.extend(arrow_findings(name, sorted(graph[name]), packages))
        if name == WORKFLOWS or name.startswith(WORKFLOWS + "."):
            out.extend(workflow_findings(name, known[name], sorted(graph[name]), packages))
    for path in sorted(known.values()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > max_lines:
            out.append(f"long module: {path.relative_to(root)} ({lines} lines)")
    return out, len(known)


def arrow_findings(name: str, deps: list[str], packages: set[str]) -> list[str]:
    """What is wrong with the imports of module `name`: a floor's arrow up or sideways, one
    backend reaching into another, a module on no floor."""
    here = floor_of(name)
    if here is None:
        return [f"module on no floor: {name} (scripts/layers.py FLOORS)"]
    out: list[str] = []
    backend = backend_of(name, packages)
    for dep in deps:
        there = floor_of(dep)
        if there is None:
            continue  # reported as its own finding
        if there[0] != here[0] and there[1] >= here[1]:
            way = "upward" if there[1] > here[1] else "sideways"
            out.append(f"{way} import: {name} ({here[0]}) -> {dep} ({there[0]})")
        target = backend_of(dep, packages)
        if here[0] == "engines" and target is not None and target != backend:
            who = f"backend {backend}" if backend is not None else "shared engine module"
            out.append(f"{who} imports another backend: {name} -> {dep}")
    return out


def workflow_findings(name: str, path: Path, deps: list[str], packages: set[str]) -> list[str]:
    """A workflow module's reach into an engine backend: an import of one (at the top, in a
    function, under TYPE_CHECKING) or a string naming one of its modules."""
    out = [
        f"workflow reaches an engine backend: {name} imports {dep} (use the registry)"
        for dep in deps
        if backend_of(dep, packages) is not None
    ]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        if MODULE_NAME.fullmatch(text) and backend_of(text.partition(":")[0], packages) is not None:
            out.append(f"workflow names an engine backend: {name} names {text!r} (use the registry)")
    return out


def module_files(root: Path) -> dict[str, Path]:
    """Module names as imported (`gate.x.y`; a package is its __init__), files relative to `root`."""
    found: dict[str, Path] = {}
    for path in sorted((root / "gate").rglob("*.py")):
        rel = path.relative_to(root)
        found[".".join(rel.with_suffix("").parts).removesuffix(".__init__")] = rel
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--max-lines", type=int, default=500, help="longest module allowed (default 500)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: here)")
    args = parser.parse_args(argv)
    if not (args.root / "gate").is_dir():
        print(f"layers: no gate/ package under {args.root} (run from the repository root)", file=sys.stderr)
        return 2
    found, count = findings(args.root, args.max_lines)
    for line in found:
        print(line)
    print(f"layers: {len(found)} findings in {count} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
