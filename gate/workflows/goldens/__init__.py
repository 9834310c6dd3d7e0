"""Goldens: recording an engine's own outputs and checking later builds against them."""
