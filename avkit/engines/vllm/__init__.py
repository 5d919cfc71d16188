"""avkit and vLLM (docs/vllm.md). Inside vLLM's processes: plugin.py (the `vllm serve` plugin: trace, estimator
warm start), stat_logger.py and health.py (calibration health on /metrics), hooks.py (what vLLM drafted and
verified), cpu_fix.py, offline.py (an offline `LLM`). In avkit: driver.py (vLLM's venv, offline.py run there),
record.py (`record --engine vllm`), profile.py (`profile --engine vllm`), metrics.py (`import vllm-metrics`).
This package's __init__ imports nothing.
"""
