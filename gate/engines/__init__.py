"""Engines gate can run; see `gate.core.engine` for the contract."""
