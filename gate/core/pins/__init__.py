"""Oracle pins: suites, oracle settings, pin folders, pin diffs."""
