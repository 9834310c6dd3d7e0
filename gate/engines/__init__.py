"""Engines gate can run; see `gate.engines.base` for the contract."""
