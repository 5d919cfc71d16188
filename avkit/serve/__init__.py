"""`avkit serve`: an OpenAI-compatible HTTP server around the speculative decoding engine.

Reading order:
  protocol.py     the wire format: validated request bodies, response/chunk bodies, error envelope
  engine_loop.py  the one thread that runs the engine: bounded admission, continuous batching, cancel
  text_stream.py  token ids -> text deltas with stop sequences (streamed == non-streamed)
  completions.py  the two generation endpoints (SSE and JSON), disconnect handling
  app.py          FastAPI app: auth, error handlers, /health, /v1/models, /metrics, lifespan
  metrics.py      Prometheus metrics (per-position drafted/verified/accepted, budget, coefficients)
  snapshot.py     live coefficients published after refits and snapshotted atomically
  server.py       assembly from ServeConfig (models, policy, sink, --record) and SIGTERM handling
  testing.py      run a real server on loopback in a thread (tests, bench/load_test.py)
"""
