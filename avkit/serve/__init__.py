"""`avkit serve`: an OpenAI-compatible HTTP server around the speculative decoding engine.

Reading order:
  openai_api.py   the OpenAI wire format: validated request bodies, response/chunk bodies, ApiError's envelope
  engine_loop.py  the one thread that runs the engine: bounded admission, continuous batching, cancel
  text_stream.py  token ids -> text deltas with stop sequences (streamed == non-streamed)
  state.py        what every route shares: ServeState
  completions.py  the two generation endpoints (SSE and JSON), off-loop tokenization, disconnects, and
                  `Generation`: one request's n choices in the engine, their merged text events
  app.py          FastAPI app: auth, error envelopes, /health, /v1/models, /metrics, lifespan; its ASGI
                  layers: contained 500s, request counts + access log, body-size cap (413)
  metrics.py      Prometheus metrics (per-position drafted/verified/accepted, budget, coefficients)
  side_writes.py  snapshot / trace writes that fail: counted, logged once, backed off, /health degraded;
                  the engine's sink (metrics, --record rows)
  snapshot.py     live coefficients published after refits, snapshotted atomically with the learned cost
  startup.py      warm start precedence, socket bind, --record check, the startup block
  server.py       assembly from ServeConfig (models, policy, sink, --record), SIGTERM handling, a server
                  in a thread (tests, bench/load_test.py)
"""
