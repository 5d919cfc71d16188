"""`avkit serve`: an OpenAI-compatible HTTP server around the speculative decoding engine.

Reading order: openai_api.py (the wire format, ApiError's envelope) -> engine_loop.py (the one thread that
runs the engine) -> text_stream.py (ids -> text deltas, stop sequences) -> state.py (ServeState) ->
completions.py (the two generation routes) -> app.py (the other routes and the ASGI layers) -> metrics.py ->
side_writes.py (writes that may fail; the --record sink) -> snapshot.py (live coefficients) -> startup.py
(warm start, bind, the startup block) -> server.py (assembly, SIGTERM, a server in a thread).
"""
