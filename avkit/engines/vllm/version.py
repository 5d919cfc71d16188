"""The vLLM versions avkit supports, and how avkit reports inside a vLLM process (standard library only: both
sides import it)."""

from __future__ import annotations

import logging
import re

SUPPORTED = ">=0.32.0,<0.33"  # the V1 methods hooks.py wraps are those of vLLM 0.32.x


def supported(version: str) -> bool:
    """Is this vLLM version in SUPPORTED? (`0.32.0`, `0.32.1+cpu`, `0.32.0rc1` are; `0.31.2` is not)."""
    return re.match(r"0\.32(\D|$)", version) is not None


def error(message: str) -> None:
    """Inside a vLLM server (plugin.py): one `avkit: error:` line on vLLM's log, never a raise."""
    logging.getLogger("avkit.vllm").error("avkit: error: %s", message)
