"""Shared test helpers: fake engines and servers, tiny models, trace builders, the CLI runner."""
