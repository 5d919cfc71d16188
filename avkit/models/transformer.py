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
from avkit.models import cpu_linear, native
from avkit.models.config import ModelConfig
from avkit.models.cpu_linear import PackedLinear
from avkit.models.kv_cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


@dataclass(frozen=True)
class HostLengths:
    """What the caller knows on the host about one forward (trusted to match the tensors), so the forward reads
    nothing back from the device."""

    slots: tuple[int, ...]  # the ``slots`` tensor
    cached: tuple[int, ...]  # ``cache.lengths[slots]`` before this forward
    q_lens: tuple[int, ...]  # the ``q_lens`` tensor

    def __post_init__(self):
        if not len(self.slots) == len(self.cached) == len(self.q_lens):
            raise ConfigError(f"HostLengths: slots, cached and q_lens need one entry per row, got "
                              f"{len(self.slots)}, {len(self.cached)}, {len(self.q_lens)}")


@dataclass
class _Step:
    """Per-forward metadata shared by every layer (computed once)."""

    slots: torch.Tensor  # [B] int64
    write_pos: torch.Tensor  # [B, S] cache position each query's key/value is written to (pads: the last real one)
    write_src: torch.Tensor | None  # [B, S] query whose key/value goes there (pads repeat the last real); None = all
    mask: torch.Tensor | None  # [B, 1, G*S, span] bool, True = may attend; None when every query sees all keys
    ends: torch.Tensor | None  # [B, S] keys each query attends: the CPU backend's attention; else None
    cos: torch.Tensor  # [B, S, D]
    sin: torch.Tensor  # [B, S, D]
    span: int
    rows: torch.Tensor | slice | None  # cache rows of the slots: a slice when consecutive (a view, not a copy)
    bulk: bool = False  # a prefill: packed CPU linears run on oneDNN (cpu_linear.bulk_linear), decode/verify never do
    flat: torch.Tensor | None = None  # [N] a ragged forward's real tokens in the flattened [B*S]; None = padded rows


def _linear(layer: nn.Module, x: torch.Tensor, bulk: bool) -> torch.Tensor:
    """``layer(x)``; a packed CPU linear also gets ``bulk`` (prefill rows on oneDNN's fast path)."""
    return layer(x, bulk=True) if bulk and isinstance(layer, PackedLinear) else layer(x)


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
        qk, v = _linear(self.qkv, x, step.bulk).split([(h + h_kv) * d, h_kv * d], dim=-1)
        qk = qk.view(B, S, h + h_kv, d)  # queries and keys rotate together: the same elementwise ops, half the calls
        cos, sin = step.cos[:, :, None], step.sin[:, :, None]  # [B, S, 1, D]
        q, k = (qk * cos + _rotate_half(qk) * sin).split([h, h_kv], dim=2)  # [B, S, H, D], [B, S, H_kv, D]
        v = v.view(B, S, h_kv, d)
        cache.append(self.layer, step.slots, step.write_pos, step.write_src, k, v)
        if step.ends is not None:  # CPU backend: per query row over its own span, batch-invariant (native.py)
            out = native.attention(q, cache.k[self.layer], cache.v[self.layer], step.slots, step.ends, d ** -0.5)
        else:
            keys = cache.k[self.layer, step.rows, :, :step.span]  # [B, H_kv, span, D]
            values = cache.v[self.layer, step.rows, :, :step.span]
            # GQA without repeating K/V: the G query heads of one kv head become G*S query rows.
            q = q.view(B, S, h_kv, g, d).permute(0, 2, 3, 1, 4).reshape(B, h_kv, g * S, d)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)  # [B, H_kv, G*S, D]
            out = out.view(B, h_kv, g, S, d).permute(0, 3, 1, 2, 4)  # [B, S, H_kv, G, D]
        return _linear(self.o, out.reshape(B, S, h * d), step.bulk)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, bulk: bool = False) -> torch.Tensor:
        if bulk and getattr(self.gate_up, "bulk_weight", None) is not None and x.device.type == "cpu":
            return cpu_linear.gated_mlp(x, self.gate_up.bulk_weight, self.down.bulk_weight)  # oneDNN, block by block
        gate, up = _linear(self.gate_up, x, bulk).chunk(2, dim=-1)
        return _linear(self.down, F.silu(gate) * up, bulk)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, step: _Step, cache: KVCache) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), step, cache)
        return x + self.mlp(self.mlp_norm(x), step.bulk)


class Transformer(nn.Module):
    """The decoder. Build on the meta device and ``load_state_dict(..., assign=True)`` (see ``avkit.models.load``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)
        self.cpu_attention = False  # pack_for_cpu() turns it on: attention by native.attention
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [positions, D]

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, max_batch: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache(c.num_layers, max_batch, c.num_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, q_lens: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                logits: str | torch.Tensor = "all", *, host: HostLengths | None = None,
                prefill: bool = False) -> torch.Tensor:
        """Append ``q_lens[b]`` tokens to cache slot ``slots[b]`` and return float32 logits.

        tokens [B, S] int64 right-padded; q_lens [B] int64 in [1, S]; slots [B] int64 distinct.
        logits: ``"all"`` -> [B, S, V]; ``"last"`` -> [B, V] at each row's last real token (the LM head
        runs on B rows only); an int64 tensor [B, n] of query indices -> [B, n, V].
        host: the same lengths as host ints (:class:`HostLengths`): nothing is then read back from the device
        (no synchronisation, CUDA-graph friendly), and token ids are not range-checked (the caller's job).
        prefill: the tokens are prompt (or catch-up) runs: on the CPU backend the linears run on oneDNN's
        bulk path (cpu_linear.bulk_linear; each token's result still independent of the others in the forward).
        Runs under ``torch.inference_mode()``: the logits are inference tensors (use out-of-place ops or
        ``.clone()`` them before editing in place outside inference mode).
        """
        step = self._step(tokens, q_lens, slots, cache, host, prefill)
        B, S = tokens.shape
        if step.flat is not None:  # ragged: the real tokens only, one per row (pads never computed)
            tokens = tokens.reshape(-1)[step.flat][:, None]  # [N, 1]
        elif step.write_src is not None:  # pad ids may be anything (-1); never looked up
            tokens = tokens.gather(1, step.write_src)
        if host is None:  # a caller passing host lengths vouches for its ids (the engine checks prompts)
            out_of_range = (tokens < 0) | (tokens >= self.config.vocab_size)
            if bool(out_of_range.any()):
                raise ConfigError(f"forward: token id {int(tokens[out_of_range][0])} outside the vocabulary "
                                  f"[0, {self.config.vocab_size})")
        x = self.embed(tokens)  # [B, S, d]; ragged: [N, 1, d]
        for block in self.layers:
            x = block(x, step, cache)
        cache.lengths[slots] += q_lens.to(cache.lengths.device)
        if step.flat is not None and isinstance(logits, str) and logits == "all":  # the LM head on real rows only
            real = self._head(self.norm(x[:, 0]))  # [N, V]
            return real.new_zeros(B * S, real.shape[-1]).index_copy_(0, step.flat, real).view(B, S, -1)  # pads 0
        if step.flat is not None:  # back to [B, S, d] rows (pads zero) for the logits' indexing
            x = x.new_zeros(B * S, x.shape[-1]).index_copy_(0, step.flat, x[:, 0]).view(B, S, -1)
        if isinstance(logits, str) and logits == "last":
            x = x[torch.arange(x.shape[0], device=x.device), q_lens - 1]  # [B, d]
        elif isinstance(logits, torch.Tensor):
            x = x.gather(1, logits[..., None].expand(-1, -1, x.shape[-1]))  # [B, n, d]
        elif logits != "all":
            raise ConfigError(f"logits must be 'all', 'last' or an index tensor, got {logits!r}")
        return self._head(self.norm(x))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of normed hidden states [..., d] -> [..., V]."""
        return (F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)).float()

    def pack_for_cpu(self) -> bool:
        """CPU backend: every bf16 linear (and the LM head, tied: a packed copy of the embedding) pre-packed
        (cpu_linear.py), attention per query row (native.attention) where its kernel builds and the heads fit:
        the same computation, batch-invariant. A no-op (False) off the CPU, for float32 or without the kernel."""
        if self.device.type != "cpu" or self.dtype != torch.bfloat16 or not cpu_linear.available():
            return False
        bulk = cpu_linear.bulk_available()  # prefill on oneDNN too (a second copy of each layer weight)
        for block in self.layers:
            for owner, name in ((block.attn, "qkv"), (block.attn, "o"), (block.mlp, "gate_up"), (block.mlp, "down")):
                lin = getattr(owner, name)
                setattr(owner, name, PackedLinear(lin.weight, lin.bias, bulk=bulk))
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        self.lm_head = PackedLinear(head, None)  # prefills compute no logits
        c = self.config
        self.cpu_attention = (native.load("attention") is not None and c.head_dim % 8 == 0
                              and c.num_heads // c.num_kv_heads <= native.MAX_GROUP)
        return True

    @property
    def ragged_prefill(self) -> bool:
        """A forward may batch runs of any lengths and computes real tokens only (the CPU backend, whose attention
        takes each query row alone); elsewhere pads cost a full token each (``runtime/prefill.py`` groups runs)."""
        return self.cpu_attention and self.device.type == "cpu"

    def rope(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[>= n, D]`` in the model's dtype, by position. Each position's row is computed once and
        kept, so its value never depends on which other positions a forward needs (batch invariance)."""
        table = self._rope_table
        if table is not None and (table[0].device != self.device or table[0].dtype != self.dtype):
            table = None
        if table is None or table[0].shape[0] < n:
            table = self._grow_rope(table, n)
        return table

    @torch.inference_mode(False)  # plain tensors: the model stays deep-copyable and movable after forwards
    def _grow_rope(self, table, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        have = 0 if table is None else table[0].shape[0]
        pos = torch.arange(have, max(n, 2 * have, 1024), device=self.device).float()
        d = self.config.head_dim
        exps = torch.arange(0, d, 2, dtype=torch.int64, device=self.device).float() / d
        freqs = pos[:, None] * (1.0 / (self.config.rope_theta ** exps))  # [new, D/2], inv_freq in float32 as in HF
        emb = torch.cat((freqs, freqs), dim=-1)  # [new, D]
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self._rope_table = (cos, sin) if table is None else (torch.cat([table[0], cos]), torch.cat([table[1], sin]))
        return self._rope_table

    def _step(self, tokens, q_lens, slots, cache: KVCache, host: HostLengths | None, prefill: bool) -> _Step:
        if tokens.ndim != 2 or q_lens.shape != tokens.shape[:1] or slots.shape != tokens.shape[:1]:
            raise ConfigError(f"forward: tokens must be [B, S] with q_lens and slots [B], got "
                              f"{tuple(tokens.shape)}, {tuple(q_lens.shape)}, {tuple(slots.shape)}")
        B, S = tokens.shape
        s_list = list(host.slots) if host is not None else slots.tolist()  # .tolist(): a sync off the CPU
        if len(set(s_list)) != len(s_list) or len(s_list) != B or min(s_list) < 0 or max(s_list) >= cache.max_batch:
            raise ConfigError(f"forward: slots must be {B} distinct values in [0, {cache.max_batch}), got {s_list}")
        if host is None:
            host = HostLengths(tuple(s_list), tuple(cache.lengths[slots].tolist()), tuple(q_lens.tolist()))
        if min(host.q_lens) < 1 or max(host.q_lens) > S:
            raise ConfigError(f"forward: q_lens must be in [1, {S}], got {list(host.q_lens)}")
        ends = [c + q for c, q in zip(host.cached, host.q_lens)]
        if max(ends) > cache.max_len:
            raise ConfigError(f"forward: slot {s_list[ends.index(max(ends))]} would reach length {max(ends)} "
                              f"> max_len={cache.max_len}")
        dev = cache.lengths.device
        old = cache.lengths[slots]  # [B]
        ar = torch.arange(S, device=dev)
        positions = old[:, None] + ar  # [B, S]
        padded = min(host.q_lens) < S
        # Pads write the key/value of their row's last real token to its position: no boolean indexing, and
        # duplicate writes of equal values whatever order the device applies them in.
        write_src = torch.minimum(ar[None, :], q_lens.to(dev)[:, None] - 1) if padded else None  # [B, S]
        write_pos = old[:, None] + write_src if padded else positions  # [B, S]
        cos, sin = self.rope(max(host.cached) + S)  # [>= positions, D]
        if self.ragged_prefill and (prefill or padded):
            # Ragged: each real token becomes a row of its own ([N, 1]: its slot, position and key span), so
            # linears, norms, the MLP and the LM head never compute a pad. A prefill's prompts share the bulk
            # linears' fixed-size row blocks; a verify forward of uneven drafts (one row verifying 7 among 15
            # verifying none) costs its Sum(q_lens) tokens, not B * max(q_lens). Per-row maths throughout: a
            # token's result is the padded path's, bit for bit.
            flat = (ar[None, :] < q_lens.to(dev)[:, None]).reshape(-1).nonzero().squeeze(1)  # [N] into [B*S]
            pos = positions.reshape(-1)[flat][:, None]  # [N, 1]
            return _Step(slots.repeat_interleave(q_lens.to(dev)), pos, None, None, pos + 1, cos[pos], sin[pos],
                         max(ends), None, prefill, flat)
        mask = ends_q = None  # every row at the same length, one query each (decode): no mask, SDPA's fast path
        if self.ragged_prefill:  # the CPU backend, no pads here: each query row over its own span
            ends_q = positions + 1  # [B, S]
        elif S > 1 or len(set(ends)) > 1:
            g = self.config.num_heads // self.config.num_kv_heads
            mask = torch.arange(max(ends), device=dev)[None, None, :] <= positions[:, :, None]  # [B, S, span]
            mask = mask[:, None, None].expand(B, 1, g, S, max(ends)).reshape(B, 1, g * S, max(ends))
        rows = slice(s_list[0], s_list[0] + B) if s_list == list(range(s_list[0], s_list[0] + B)) else slots
        return _Step(slots, write_pos, write_src, mask, ends_q, cos[positions], sin[positions], max(ends), rows, prefill)
