"""`avkit serve`: an OpenAI-compatible HTTP server around the speculative decoding engine (docs/runtime.md,
"Serving", gives the reading order)."""
