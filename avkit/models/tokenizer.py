"""Tokenizer: byte-level BPE from ``tokenizer.json`` or GGUF metadata, chat template rendered with jinja2.

Glossary
--------
byte-level BPE   GPT-2 style: text -> regex pre-tokens -> bytes mapped to printable unicode -> BPE merges
pre-tokenizer    the regex that splits text before BPE; Qwen2 splits digits one by one (``\\p{N}``)
special tokens   added tokens (``<|im_start|>``...) matched verbatim before BPE; GGUF token types 3 and 4
chat template    the model's jinja2 template (``tokenizer.chat_template``) rendered as HF does it
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from avkit.errors import ModelError
from avkit.jsonsafe import read_json

# llama.cpp ``tokenizer.ggml.pre`` -> the split regex of the HF tokenizer it came from
PRETOKENIZER_REGEX = {
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the model's chat template and stop tokens."""

    def __init__(self, tok, chat_template: str | None, eos_token_ids: set[int], bos_token: str = "",
                 eos_token: str = ""):
        self._tok = tok
        self.chat_template = chat_template
        self.eos_token_ids = set(eos_token_ids)
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it works (encode does not): the server tokenizes in a
        # worker thread, and a multi-MB prompt must not stall its event loop. Same ids as encode.
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # a tensor, an array or a list
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> list[int]:
        """Render the chat template (as transformers does) and encode it."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools))

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise ModelError("tokenizer has no chat_template; encode the prompt text instead")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token, eos_token=self.eos_token)

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        """``tokenizer.json`` (+ ``tokenizer_config.json`` and ``generation_config.json`` if present)."""
        if not (path / "tokenizer.json").is_file():
            raise ModelError(f"{path}: no tokenizer.json")
        tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        conf, gen = ({} if not f.is_file() else read_json(f, error=ModelError)
                     for f in (path / "tokenizer_config.json", path / "generation_config.json"))
        bos, eos = (t.get("content") if isinstance(t, dict) else t for t in (conf.get("bos_token"), conf.get("eos_token")))
        eos_ids = {tok.token_to_id(eos)} if eos and tok.token_to_id(eos) is not None else set()
        gen_eos = gen.get("eos_token_id", [])
        eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        template = conf.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        return cls(tok, template, eos_ids, bos or "", eos or "")

    @classmethod
    def from_gguf(cls, metadata: dict, source: str) -> Tokenizer:
        """Rebuild the HF byte-level BPE tokenizer from GGUF ``tokenizer.ggml.*`` key/values."""
        get = metadata.get
        model, pre = get("tokenizer.ggml.model"), get("tokenizer.ggml.pre", "gpt2")
        if model != "gpt2":
            raise ModelError(f"{source}: unsupported GGUF tokenizer model {model!r} (supported: gpt2 byte-level BPE)")
        if pre not in PRETOKENIZER_REGEX:
            raise ModelError(f"{source}: unsupported GGUF pre-tokenizer {pre!r} "
                             f"(supported: {sorted(PRETOKENIZER_REGEX)})")
        tokens, types = get("tokenizer.ggml.tokens"), get("tokenizer.ggml.token_type")
        merges = get("tokenizer.ggml.merges")
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges],
                         ignore_merges=False)
        tok = byte_level(HFTokenizer(bpe), pre)
        tok.add_tokens([AddedToken(t, special=ty == 3, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)])
        eos_ids = {get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")} - {None}
        eos_ids |= {i for i, t in enumerate(tokens) if t in _END_TOKENS and types[i] == 3}
        bos = get("tokenizer.ggml.bos_token_id")
        eos = get("tokenizer.ggml.eos_token_id")
        return cls(tok, get("tokenizer.chat_template"), eos_ids,
                   tokens[bos] if bos is not None else "", tokens[eos] if eos is not None else "")


def byte_level(tok, pre: str):
    """``tok`` (a ``tokenizers.Tokenizer``) with NFC, the ``pre`` split regex and byte-level mapping / decoding."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZER_REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _compile_template(source: str):
    from jinja2.ext import loopcontrols  # lazy: jinja2 (chat templates)
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # lazy: jinja2

    def raise_exception(message):
        raise ModelError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
