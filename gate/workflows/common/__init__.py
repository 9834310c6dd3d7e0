"""What every workflow shares: engine calls under a guard, progress, provenance and requests."""
