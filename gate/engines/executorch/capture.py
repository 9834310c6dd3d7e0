"""`gate diagnose`'s capture of gate's ExecuTorch program: its own ETDump, named by its ETRecord,
run in a child process (`gate.engines.executorch.etdump`, whose doc says how each logged
tensor is named and what stays hidden).

The debug buffer is sized from the ETRecord's graph (`buffer_estimate`) unless the engine
option `debug_buffer_mb` sets it. ExecuTorch 1.5.1 aborts the process that runs out of
it (SIGABRT): the child dies, gate survives; an estimated buffer is then doubled, twice at
most, and a buffer the user set is one clear EngineError naming the option.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gate.core.diagnosis.dump import read_safetensors
from gate.errors import EngineError

CHILD = "gate.engines.executorch.etdump"
RETRIES = 2  # an estimated buffer that runs out is doubled this many times at most
OUT_OF_BUFFER = "Ran out of space to store intermediate outputs"


def layer_names(layers: int) -> list[str]:
    """Every module name `gate diagnose` compares in a Llama-family decoder of `layers` layers."""
    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    names = ["model.embed_tokens"]
    for i in range(layers):
        names += [f"model.layers.{i}.{p}" for p in parts] + [f"model.layers.{i}"]
    return [*names, "model.norm", "lm_head"]


def run_capture(
    pte: Path,
    etrecord: Path,
    token_ids: Sequence[int],
    names: Sequence[str],
    *,
    buffer_mb: int | None = None,
    first_bytes: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The named arrays ([positions, width] float32) of one forward of `pte` over
    `token_ids` and facts about the run, from a child process. The buffer: `buffer_mb`, as
    given; else `first_bytes` (None: the child's estimate), doubled when it runs out."""
    size: int | None = first_bytes if buffer_mb is None else buffer_mb << 20
    for attempt in range(RETRIES + 1):
        done, arrays, facts, said = _child(pte, etrecord, token_ids, names, size)
        if done.returncode == 0:
            return arrays, facts
        used = size if size is not None else _told_size(said)
        ran_out = any(OUT_OF_BUFFER in line for line in said)
        if ran_out and buffer_mb is None and used is not None and attempt < RETRIES:
            size = used * 2
            continue
        how = _death(done.returncode)
        if ran_out:
            raise EngineError(
                f"the ExecuTorch runtime ran out of its {_size(used or 0)} debug buffer logging {pte.name}'s "
                f"outputs over {len(token_ids)} tokens, and the child process gate ran it in {how}: give a larger "
                "one with --engine-opt debug_buffer_mb=N"
            )
        last = said[-1] if said else "no message"
        raise EngineError(f"the ExecuTorch capture of {pte} {how}: {last}")
    raise AssertionError("unreachable")


def _child(
    pte: Path, etrecord: Path, token_ids: Sequence[int], names: Sequence[str], size: int | None
) -> tuple[subprocess.CompletedProcess[str], dict[str, np.ndarray], dict[str, Any], list[str]]:
    with tempfile.TemporaryDirectory(prefix="gate-etdump-") as tmp:
        request, out = Path(tmp) / "request.json", Path(tmp) / "named.safetensors"
        request.write_bytes(orjson.dumps({"token_ids": list(token_ids), "names": list(names), "buffer_bytes": size}))
        argv = [sys.executable, "-m", CHILD, str(pte), str(etrecord), str(request), str(out)]
        here = str(Path(__file__).resolve().parents[3])  # the child imports this very gate
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": here if not path else f"{here}{os.pathsep}{path}"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        said = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()]
        if done.returncode != 0 or not out.is_file():
            return done, {}, {}, said
        arrays, _ = read_safetensors(out.read_bytes(), str(out))
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.strip()]
    try:
        facts: Mapping[str, Any] = orjson.loads(lines[-1]) if lines else {}
    except orjson.JSONDecodeError:
        facts = {}
    return done, arrays, dict(facts), said


def _told_size(said: Sequence[str]) -> int | None:
    """The buffer size the child said it used ("debug buffer: N bytes")."""
    for line in said:
        if line.startswith("debug buffer: ") and line.endswith(" bytes"):
            return int(line.removeprefix("debug buffer: ").removesuffix(" bytes"))
    return None


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB" if n >= 1 << 20 else f"{n / (1 << 10):.0f} kB"


def _death(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"failed (exit status {code})"
