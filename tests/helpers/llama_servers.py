"""Real llama.cpp servers on 127.0.0.1 for tests, on free ports, on the default GGUF.

- llama-server: `.venv/bin/llama-server` (scripts/install.sh --llama-server); the engine starts
  it itself, so tests only need to know whether the binary is there.
- llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, the text-prompt
  server): started here, in its own process group so teardown ends exactly it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from gate.engines.http.llama_server_process import find_binary
from gate.errors import InputError
from helpers.vllm_server import free_port

STARTUP_S = 120.0


def llama_server_binary() -> Path | None:
    try:
        return find_binary(None)
    except InputError:
        return None


def have_llama_cpp_python_server() -> bool:
    modules = ("llama_cpp", "fastapi", "uvicorn", "starlette_context")
    return all(importlib.util.find_spec(m) is not None for m in modules)


@contextlib.contextmanager
def llama_cpp_python_server(gguf: Path, *, threads: int = 1) -> Iterator[str]:
    """`python -m llama_cpp.server` on `gguf`; yields its base URL."""
    port = free_port()
    with tempfile.TemporaryFile(prefix="gate-llama-cpp-python-") as log:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "2048"]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + STARTUP_S
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode("utf-8", "replace")[-2000:]
                    raise RuntimeError(f"llama_cpp.server did not start: {tail}")
                try:
                    with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.2)
            yield url
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
