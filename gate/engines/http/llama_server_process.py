"""Start and stop a llama-server process on 127.0.0.1 for `--engine llama-server`.

Used when no `base_url` is given: gate starts llama.cpp's own server binary on the GGUF, on a
free port of the loopback interface, waits for `/health` to answer 200, and stops it on
`close()`. Its log goes to a temporary file, quoted (last lines) when it fails to start.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from gate.errors import EngineError, InputError

LOG_TAIL_LINES = 8
STOP_WAIT_S = 10.0


def find_binary(explicit: str | None) -> Path:
    """The llama-server executable: `explicit`, else the one beside this Python (where
    `scripts/install.sh --llama-server` puts it), else the first on PATH."""
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise InputError(f"--engine-opt binary={explicit}: not an executable file")
        return path
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise InputError(
        "engine 'llama-server': no llama-server binary (looked beside the Python executable and on PATH); "
        "build one with `scripts/install.sh --llama-server`, give it with --engine-opt binary=PATH, "
        "or point gate at a running server with --engine-opt base_url=http://HOST:PORT"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServerProcess:
    """One llama-server child process; `url` is where it listens once `start()` returned."""

    def __init__(self, binary: Path, args: Sequence[str], *, startup_timeout: float) -> None:
        self.binary = binary
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return [str(self.binary), *self.args, "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> None:
        # A port taken between free_port() and the server's bind is tried once more.
        for attempt in range(2):
            self.port = free_port()
            self._log = tempfile.TemporaryFile(prefix="gate-llama-server-")  # noqa: SIM115 (closed in stop())
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
            )
            try:
                self._wait_healthy()
                return
            except EngineError:
                tail = self.log_tail()
                self.stop()
                if attempt == 0 and "bind" in tail.lower():
                    continue
                raise EngineError(f"llama-server did not start ({' '.join(self.command)}): {tail}") from None

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise EngineError(f"it exited with status {code}")
            if self._health() == 200:
                return
            time.sleep(0.1)
        raise EngineError(f"/health did not answer 200 within {self.startup_timeout:g} s")

    def _health(self) -> int | None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            return int(resp.status)
        except OSError:
            return None  # not listening yet
        finally:
            conn.close()

    def log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [ln.strip() for ln in self._log.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return " | ".join(lines[-LOG_TAIL_LINES:]) or "(no output)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
