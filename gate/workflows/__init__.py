"""The workflows that drive engines: a run against a pin, recording a pin, goldens, the
self-test and calibration. They sit above `gate.core` (the pure domain and the engine
contract) and `gate.engines` (the adapters), and below `gate.reports` and `gate.cli`."""
