"""Pins: recording an oracle's run, showing it, and measuring its honest floor."""
