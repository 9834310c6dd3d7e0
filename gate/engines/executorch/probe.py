"""A program gate did not build (`--engine-opt pte=FILE`) is first loaded in a child process
(`python -m gate.engines.executorch.probe PTE`), as the ETDump capture runs its programs: the
ExecuTorch runtime does not check a program's contents past its header, and a corrupt or
hostile `.pte` aborts or crashes the process that loads or runs it (SIGABRT, SIGSEGV). The
child loads the program, its forward method and its constant methods, and runs one forward
step; if it dies, gate survives and says so in one line (EngineError, exit 3). Python errors
in the child are not the probe's business: the engine meets them again, in its own words.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gate.errors import EngineError

CHILD = "gate.engines.executorch.probe"
TIMEOUT_S = 600  # a load and one forward step of a program that fits in memory take seconds


def probe(pte: Path) -> None:
    """Load and run `pte` once in a child process; EngineError when the child dies."""
    here = str(Path(__file__).resolve().parents[3])  # the child imports this very gate
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": here if not path else f"{here}{os.pathsep}{path}"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", CHILD, str(pte)],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"ExecuTorch cannot load {pte}: loading it took more than {TIMEOUT_S} s") from None
    if done.returncode == 0:
        return
    said = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()]
    reason = said[-1][:300] if said else "it said nothing"
    raise EngineError(
        f"ExecuTorch cannot load {pte}: the runtime {_death(done.returncode)} loading it in a child process "
        f"(a corrupt or foreign program; gate itself is unharmed); last words: {reason}"
    )


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"failed (exit status {code})"


def main(argv: list[str]) -> int:
    """The child: load the program, its methods, and run forward on one token."""
    import contextlib

    import torch
    from executorch.runtime import Runtime, Verification

    with contextlib.suppress(ImportError, OSError, AssertionError):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 (registers the LLM kernels)
    (pte,) = argv
    try:
        program = Runtime.get().load_program(Path(pte), verification=Verification.Minimal)
        for name in sorted(program.method_names):
            method = program.load_method(name)
            if name != "forward":
                method.execute([])
        if "forward" in program.method_names:
            forward = program.load_method("forward")
            forward.execute([torch.zeros((1, 1), dtype=torch.long), torch.zeros((1,), dtype=torch.long)])
    except Exception as exc:  # a refusal in Python words: the engine reports it itself
        print(f"probe: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
