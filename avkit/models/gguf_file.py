"""A minimal GGUF (v2/v3) reader: key/values, the tensor index, and tensor bytes from one memory map.

gguf-py's GGUFReader builds a numpy memmap view per array element and takes ~20-40 s on the 151,936-token
vocabulary of Qwen2.5; this parses the same header with ``struct`` in well under a second.

Glossary
--------
KV          header key/values (``general.architecture``, ``tokenizer.ggml.tokens`` ...)
ggml dims   tensor dims fastest-first; the row-major (torch/HF) shape is their reverse
alignment   tensor data starts at a multiple of ``general.alignment`` (default 32) after the header
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avkit.errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


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
        except (struct.error, UnicodeDecodeError, IndexError, KeyError) as e:
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
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype != _ARRAY:
        raise ModelError(f"unknown GGUF value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _NUMPY:  # numeric arrays in one read
        a = np.frombuffer(buf, dtype=_NUMPY[etype], count=count, offset=pos)
        return a.tolist(), pos + a.nbytes
    out = []
    for _ in range(count):
        v, pos = _value(buf, pos, etype)
        out.append(v)
    return out, pos
