"""Calibration: drift statistics, the recommended doctrine, the self-test's judging."""
