"""`scripts/install.sh --dev --llama-server` compiles llama.cpp once: llama-server and
llama-cpp-python (the `llamacpp` engine) run the same shared libraries of one build
(scripts/build_llama_server.sh --llamacpp). Reads files and runs `ldd`; loads no model."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.llama_servers import llama_server_binary

LIBS = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_llama_server_and_llama_cpp_python_share_one_build() -> None:
    if not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        pytest.skip("checks ELF shared libraries with ldd (Linux)")
    binary = llama_server_binary()
    spec = importlib.util.find_spec("llama_cpp")
    if binary is None or spec is None or spec.origin is None:
        pytest.skip("needs llama-server and llama-cpp-python (scripts/install.sh --dev --llama-server)")
    server_dir = binary.resolve().parent
    package_lib = Path(spec.origin).parent / "lib"
    for name in LIBS:
        beside = server_dir / name
        assert beside.is_file(), f"no {name} beside {binary.resolve()}: llama-server is a second, separate compile"
        assert _sha256(beside) == _sha256(package_lib / name), (
            f"{package_lib / name} differs from {beside}: llama-cpp-python runs another build than llama-server"
        )
    # The server loads exactly those libraries (RUNPATH $ORIGIN), not others found elsewhere. ldd
    # on the resolved path: run through .venv/bin's symlink the loader takes $ORIGIN from
    # /proc/self/exe (resolved) too, but ldd takes it from the path it is given.
    out = subprocess.run(["ldd", str(binary.resolve())], capture_output=True, text=True, timeout=30, check=True).stdout
    resolved = {
        line.split("=>")[0].strip(): line.split("=>")[1].split("(")[0].strip()
        for line in out.splitlines()
        if "=>" in line
    }
    for soname in ("libllama.so.0", "libggml.so.0", "libggml-base.so.0"):
        assert soname in resolved, f"llama-server does not link {soname} (ldd: {out!r})"
        assert Path(resolved[soname]).resolve().parent == server_dir, f"{soname} resolves to {resolved[soname]}"
