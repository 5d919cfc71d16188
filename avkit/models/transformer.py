"""A compact Llama / Qwen2 decoder with a slot-based KV cache (gpt-fast / nano-vllm spirit).

Glossary
--------
B, S        rows in the batch, padded number of new (query) tokens per row
q_lens      real new tokens per row (right-padded: tokens[b, q_lens[b]:] are ignored)
slots       KV-cache slot of each row; row b's new tokens sit at positions lengths[slot] + arange(q_lens[b])
H, H_kv, G  query heads, key/value heads, G = H / H_kv query heads per key/value head (GQA)
span        keys attended this step: max over rows of (old length + q_len)

Maths: x -> x + Attn(RMSNorm(x)) -> x + W_down(silu(W_gate x) * W_up x); RMSNorm(x) = w * x / rms(x);
RoPE rotates (x_i, x_{i+D/2}) by angle pos * theta^(-2i/D) (the HF "rotate_half" layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from avkit.errors import ConfigError
from avkit.models.config import ModelConfig
from avkit.models.kv_cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


@dataclass
class _Step:
    """Per-forward metadata shared by every layer (computed once)."""

    slots: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B, S] absolute position of each query token
    valid: torch.Tensor  # [B, S] bool, False on right padding
    mask: torch.Tensor | None  # [B, 1, G*S, span] bool, True = may attend; None when every query sees all keys
    cos: torch.Tensor  # [B, S, D]
    sin: torch.Tensor  # [B, S, D]
    span: int
    contiguous_from: int | None  # first slot when slots are consecutive (the cache is then viewed, not copied)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.h, self.h_kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.h_kv) * self.d, bias=cfg.qkv_bias)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, step: _Step, cache: KVCache) -> torch.Tensor:
        B, S, _ = x.shape
        h, h_kv, d, g = self.h, self.h_kv, self.d, self.h // self.h_kv
        q, k, v = self.qkv(x).split([h * d, h_kv * d, h_kv * d], dim=-1)
        q = q.view(B, S, h, d)
        k = k.view(B, S, h_kv, d)
        v = v.view(B, S, h_kv, d)
        cos, sin = step.cos[:, :, None], step.sin[:, :, None]  # [B, S, 1, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        cache.append(self.layer, step.slots, step.positions, step.valid, k, v)
        keys, values = cache.view(self.layer, step.slots, step.span, step.contiguous_from)  # [B, H_kv, span, D]
        # GQA without repeating K/V: the G query heads of one kv head become G*S query rows.
        q = q.view(B, S, h_kv, g, d).permute(0, 2, 3, 1, 4).reshape(B, h_kv, g * S, d)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)  # [B, H_kv, G*S, D]
        out = out.view(B, h_kv, g, S, d).permute(0, 3, 1, 2, 4).reshape(B, S, h * d)
        return self.o(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, step: _Step, cache: KVCache) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), step, cache)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """The decoder. Build on the meta device and ``load_state_dict(..., assign=True)`` (see weights.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, max_batch: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache(c.num_layers, max_batch, c.num_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    def inv_freq(self) -> torch.Tensor:
        d = self.config.head_dim
        exps = torch.arange(0, d, 2, dtype=torch.int64, device=self.device).float() / d
        return 1.0 / (self.config.rope_theta ** exps)  # [D/2], float32 as in HF

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, q_lens: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                logits: str | torch.Tensor = "all") -> torch.Tensor:
        """Append ``q_lens[b]`` tokens to cache slot ``slots[b]`` and return float32 logits.

        tokens [B, S] int64 right-padded; q_lens [B] int64 in [1, S]; slots [B] int64 distinct.
        logits: ``"all"`` -> [B, S, V]; ``"last"`` -> [B, V] at each row's last real token (the LM head
        runs on B rows only); an int64 tensor [B, n] of query indices -> [B, n, V].
        Runs under ``torch.inference_mode()``: the logits are inference tensors (use out-of-place ops or
        ``.clone()`` them before editing in place outside inference mode).
        """
        step = self._step(tokens, q_lens, slots, cache)
        tokens = torch.where(step.valid, tokens, 0)  # pad ids may be anything (-1); never looked up
        if bool(((tokens < 0) | (tokens >= self.config.vocab_size)).any()):
            bad = tokens[(tokens < 0) | (tokens >= self.config.vocab_size)][0]
            raise ConfigError(f"forward: token id {int(bad)} outside the vocabulary [0, {self.config.vocab_size})")
        x = self.embed(tokens)  # [B, S, d]
        for block in self.layers:
            x = block(x, step, cache)
        cache.lengths[step.slots] += q_lens.to(cache.lengths.device)
        if isinstance(logits, str) and logits == "last":
            x = x[torch.arange(x.shape[0], device=x.device), q_lens - 1]  # [B, d]
        elif isinstance(logits, torch.Tensor):
            x = x.gather(1, logits[..., None].expand(-1, -1, x.shape[-1]))  # [B, n, d]
        elif logits != "all":
            raise ConfigError(f"logits must be 'all', 'last' or an index tensor, got {logits!r}")
        x = self.norm(x)
        return (F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)).float()

    def pack_for_cpu(self) -> bool:
        """CPU backend: swap every bf16 linear (and the tied LM head) for a pre-packed one (cpu_linear.py).

        Same computation, a kernel that streams bf16 weights at memory bandwidth; a no-op (False) off the
        CPU, for float32, or where the kernel is unavailable. The tied head gets its own packed copy of the
        embedding (the lookup keeps the [V, d] table).
        """
        from avkit.models import cpu_linear

        if self.device.type != "cpu" or self.dtype != torch.bfloat16 or not cpu_linear.available():
            return False
        for block in self.layers:
            for owner, name in ((block.attn, "qkv"), (block.attn, "o"), (block.mlp, "gate_up"), (block.mlp, "down")):
                lin = getattr(owner, name)
                setattr(owner, name, cpu_linear.PackedLinear(lin.weight, lin.bias))
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        self.lm_head = cpu_linear.PackedLinear(head, None)
        return True

    def _step(self, tokens, q_lens, slots, cache: KVCache) -> _Step:
        if tokens.ndim != 2 or q_lens.shape != tokens.shape[:1] or slots.shape != tokens.shape[:1]:
            raise ConfigError(f"forward: tokens must be [B, S] with q_lens and slots [B], got "
                              f"{tuple(tokens.shape)}, {tuple(q_lens.shape)}, {tuple(slots.shape)}")
        B, S = tokens.shape
        q_list, s_list = q_lens.tolist(), slots.tolist()
        if min(q_list) < 1 or max(q_list) > S:
            raise ConfigError(f"forward: q_lens must be in [1, {S}], got {q_list}")
        if len(set(s_list)) != B or min(s_list) < 0 or max(s_list) >= cache.max_batch:
            raise ConfigError(f"forward: slots must be distinct in [0, {cache.max_batch}), got {s_list}")
        old = cache.lengths[slots]  # [B]
        ends = old + q_lens.to(old.device)
        span = int(ends.max())
        if span > cache.max_len:
            raise ConfigError(f"forward: slot {s_list[int(ends.argmax())]} would reach length {span} "
                              f"> max_len={cache.max_len}")
        ar = torch.arange(S, device=old.device)
        positions = old[:, None] + ar  # [B, S]
        valid = ar[None, :] < q_lens[:, None].to(old.device)  # [B, S]
        g = self.config.num_heads // self.config.num_kv_heads
        mask = None  # decode with every row at the same length (c = 1 always): no mask, SDPA's fast path
        if S > 1 or bool((ends != span).any()):
            mask = torch.arange(span, device=old.device)[None, None, :] <= positions[:, :, None]  # [B, S, span]
            mask = mask[:, None, None].expand(B, 1, g, S, span).reshape(B, 1, g * S, span)
        freqs = positions[..., None].float() * self.inv_freq()  # [B, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, S, D]
        first = s_list[0]
        contiguous = s_list == list(range(first, first + B))
        return _Step(slots, positions, valid, mask, emb.cos().to(self.dtype), emb.sin().to(self.dtype),
                     span, first if contiguous else None)
