"""JSON every parser reads (NaN and ±inf as null, numpy values as Python's: every JSON file avkit writes goes
through `dumps`, so a stray NaN fails here, not in another tool), and the one reader of a JSON input file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from avkit.errors import AvkitError, ConfigError, first_line


def json_safe(x):
    """A copy of `x` with non-finite floats as None and numpy scalars/arrays as Python values."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    elif isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def dumps(obj, **kw) -> str:
    """`json.dumps` of `json_safe(obj)`; never writes NaN."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


def read_json(path, what: str = "", error: type[AvkitError] = ConfigError):
    """The JSON value in `path`; `error` with "`what` PATH: no such file / cannot read (...) / not valid JSON (...)".

    `what` names the option or the kind of file (``"--schedule"``, ``"cost table"``); empty: the path alone.
    """
    path = Path(path).expanduser()
    where = f"{what} {path}" if what else str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except OSError as e:
        raise error(f"{where}: cannot read ({e.strerror or e})") from None
    try:
        return json.loads(raw.decode("utf-8"))  # NaN/Infinity read as floats: the caller's field check names them
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{where}: not valid JSON ({first_line(e)})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None


__all__ = ["dumps", "json_safe", "read_json"]
