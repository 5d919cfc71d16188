"""A GGUF (v2/v3) file: key/values, the tensor index, tensors dequantized to float32 (loader.py `read_gguf` maps
them to a model config and HF layout).

gguf-py's GGUFReader builds a numpy memmap view per array element and takes ~20-40 s on the 151,936-token
vocabulary of Qwen2.5; this parses the same header with ``struct`` in well under a second. Quantized blocks
go through gguf-py's own per-type ``dequantize_blocks`` in chunks: ``gguf.quants.dequantize`` wraps the same
maths in a per-row-group loop over a memmap subclass that dominates its run time (~10x on the embedding).

Glossary
--------
KV          header key/values (``general.architecture``, ``tokenizer.ggml.tokens`` ...)
ggml dims   tensor dims fastest-first; the row-major (torch/HF) shape is their reverse
alignment   tensor data starts at a multiple of ``general.alignment`` (default 32) after the header
block       ``block_size`` weights stored in ``type_size`` bytes (a float16 scale and packed codes)
GGUF names  llama.cpp's ``blk.N.attn_q.weight`` ...; the HF tensors' shapes once read (``avkit.models.loader.TENSORS``)
permute     llama.cpp's converter reorders the rows of q/k for arch ``llama`` (rotary pairs interleaved);
            :func:`unpermute_qk` undoes it. For ``qwen2`` it does not, so neither do we.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from avkit.errors import ModelError

_NUMBERS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_CHUNK_BLOCKS = 1 << 16  # ~64 MiB of float32 output per chunk for 256-weight blocks


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # row-major, e.g. (out_features, in_features)
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """``GGUFFile(path)``: ``.metadata`` (dict), ``.tensors`` (name -> GGUFTensor), ``.raw(t)`` (uint8 array)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as e:
            raise ModelError(f"{self.path}: cannot map GGUF file ({e})") from None
        buf = self._map
        if buf[:4] != b"GGUF":
            raise ModelError(f"{self.path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        try:
            self._parse(buf)
        except (struct.error, ValueError, IndexError, KeyError) as e:  # UnicodeDecodeError is a ValueError
            raise ModelError(f"{self.path}: truncated or corrupt GGUF header ({e})") from None

    def _parse(self, buf) -> None:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ModelError(f"{self.path}: unsupported GGUF version {version}")
        pos, self.metadata = 24, {}
        for _ in range(n_kv):
            key, pos = _string(buf, pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.metadata[key], pos = _value(buf, pos, vtype)
        infos = []
        for _ in range(n_tensors):
            name, pos = _string(buf, pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, ggml_type, tuple(int(d) for d in reversed(dims)), offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        self.tensors = {n: GGUFTensor(n, t, s, start + o, _nbytes(t, s)) for n, t, s, o in infos}
        for t in self.tensors.values():
            if t.offset + t.nbytes > len(buf):
                raise ModelError(f"{self.path}: tensor {t.name} lies past the end of the file (truncated?)")

    def raw(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's bytes (a copy-on-write view of the map, no copy)."""
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order for arch llama (per head, rows 0, D/2, 1, D/2+1, ...): HF's rotate-half."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Bytes of one tensor (uint8) -> a float32 tensor of row-major ``shape`` that owns its memory."""
    import gguf.quants  # lazy: gguf
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: gguf

    qtype = GGMLQuantizationType(ggml_type)
    quant = getattr(gguf.quants, qtype.name, None)
    if not hasattr(quant, "dequantize_blocks"):  # F32, F16: a view or a cast, copied off the map
        return torch.from_numpy(np.array(gguf.quants.dequantize(raw, qtype), dtype=np.float32)).reshape(shape)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, size)  # [n_blocks, type_size]
    out = np.empty((blocks.shape[0], block), dtype=np.float32)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        chunk = np.array(blocks[i:i + _CHUNK_BLOCKS])  # a plain, writable ndarray (not the map)
        out[i:i + _CHUNK_BLOCKS] = quant.dequantize_blocks(chunk).reshape(-1, block)
    return torch.from_numpy(out).reshape(shape)


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: gguf

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return int(np.prod(shape)) // block * size


def _string(buf, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8: pos + 8 + n]).decode("utf-8"), pos + 8 + n


def _value(buf, pos: int, vtype: int):
    if vtype == _STRING:
        return _string(buf, pos)
    if vtype in _NUMBERS:
        a = np.frombuffer(buf, dtype=_NUMBERS[vtype], count=1, offset=pos)
        return a[0].item(), pos + a.nbytes
    if vtype != _ARRAY:
        raise ModelError(f"unknown GGUF value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _NUMBERS:  # numeric arrays in one read
        a = np.frombuffer(buf, dtype=_NUMBERS[etype], count=count, offset=pos)
        return a.tolist(), pos + a.nbytes
    out = []
    for _ in range(count):
        v, pos = _value(buf, pos, etype)
        out.append(v)
    return out, pos
