"""Commands of this module are registered by `register(app)`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """No commands yet."""
