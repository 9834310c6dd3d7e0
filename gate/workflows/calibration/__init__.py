"""Calibration and self-test: the doctrine fitted from honest runs and planted mutants."""
