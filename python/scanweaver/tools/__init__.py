"""Developer tools: not part of the public API (golden-vector generation and the like)."""
