"""Atomic writes and file hashes (the only disk primitives of the core)."""
