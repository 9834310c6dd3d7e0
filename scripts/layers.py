#!/usr/bin/env python3
"""The house's floors, checked: no import cycle among gate's modules, no import from the
pure core (`gate/core`) up into the engines, workflows, reports or CLI, and no module
over the line limit (the trace reader and the HTML renderer excepted).

Run from the repository root: `python3 scripts/layers.py [--max-lines 500]`.
Prints one line per finding and a count; exit 0 when there are none, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

# The floors above the core, by import prefix.
ABOVE_THE_CORE = ("gate.engines", "gate.workflows", "gate.reports", "gate.cli", "gate.run")
# Modules allowed past the line limit: one format's reader, one self-contained renderer.
LONG_ALLOWED = frozenset({"trace.py", "html.py"})


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
    known = {name: root / path for name, path in module_files(root).items()}
    graph = {name: imported(path, name, known) for name, path in known.items()}
    out = [f"import cycle: {' <-> '.join(cycle)}" for cycle in strongly_connected(graph)]
    for name in sorted(graph):
        if name == "gate.core" or name.startswith("gate.core."):
            out.extend(
                f"upward import from the core: {name} -> {dep}"
                for dep in sorted(graph[name])
                if dep.startswith(ABOVE_THE_CORE)
            )
    for path in sorted(known.values()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > max_lines and path.name not in LONG_ALLOWED:
            out.append(f"long module: {path.relative_to(root)} ({lines} lines)")
    return out, len(known)


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
