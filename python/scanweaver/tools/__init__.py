"""Developer tools: not part of the public API (golden vectors, cross-compiler kernel checks)."""
