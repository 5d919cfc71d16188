"""Record traces from vLLM: `avkit record --engine vllm` (docs/vllm.md).

  protocol.py  the JSON-lines protocol and the supported vLLM versions (standard library only)
  hooks.py     runs inside vLLM: wraps its V1 draft/verify methods at run time, one record per verified draft
  child.py     runs inside vLLM: the offline engine, stepped on avkit's command
  driver.py    runs in avkit: starts the child, admits requests, turns its records into trace rows
Only protocol.py is imported by this package's __init__ (vLLM's venv has no polars or pyarrow).
"""
