"""gate: a token-exact gate for LLM inference engines."""

__version__ = "0.1.0"
