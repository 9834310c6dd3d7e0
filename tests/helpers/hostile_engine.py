"""An engine plugin (`module:Class`) that prints workflow commands while it loads, on
stdout and stderr, as a library or a server's log might, then fails: what it printed must
reach the Action's log as text, never as a command (gate.integrations.workflow_commands)."""

from __future__ import annotations

import sys

SAID = "loading\n::set-output name=verdict::strict_pass\n::notice title=gate::strict pass ##[set-output name=defects;]0"


class HostileEngine:
    def __init__(self, model: str, **options: str) -> None:
        print(SAID)  # stdout: buffered in a pipe, flushed at exit unless the step flushes it
        print(SAID, file=sys.stderr)
        raise RuntimeError(f"no device: {SAID}")
