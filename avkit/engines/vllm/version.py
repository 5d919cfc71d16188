"""The vLLM versions avkit supports, and how avkit reports inside a vLLM process (standard library only: both
sides import it)."""

from __future__ import annotations

import logging

SUPPORTED = ">=0.32.0,<0.33"  # the V1 methods hooks.py wraps are those of vLLM 0.32.x
_LO, _HI = (0, 32), (0, 33)


def supported(version: str) -> bool:
    """Is this vLLM version in SUPPORTED? (`0.32.0`, `0.32.1+cpu`, `0.32.0rc1` are; `0.31.2` is not)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            return False
        parts.append(int(digits))
    return len(parts) == 2 and _LO <= tuple(parts) < _HI


def error(message: str) -> None:
    """Inside a vLLM server (plugin.py): one `avkit: error:` line on vLLM's log, never a raise."""
    logging.getLogger("avkit.vllm").error("avkit: error: %s", message)
