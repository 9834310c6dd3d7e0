"""gate where engine teams already test: a pytest plugin (`gate_check`, registered through
the `pytest11` entry point), the GitHub Action's steps (`python -m
gate.integrations.github_action`), and the one gate both drive (`gating.gate_candidate`).

This package sits above the workflows and the reports and beside the CLI. Importing it
imports nothing heavy: pytest loads the plugin in every session of a machine where gate is
installed, so the plugin's module imports gate's modules only when a test asks to gate.
"""
