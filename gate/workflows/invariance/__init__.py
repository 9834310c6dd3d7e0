"""Schedule invariance: the same engine under other batches, caches, chunks and threads."""
