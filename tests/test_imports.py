"""Import hygiene: the engine's import pulls in neither polars nor the HVD stack; registries are lazy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from avkit.errors import ConfigError
from avkit.registry import Registry


def _modules_after(statement: str) -> set[str]:
    """sys.modules of a fresh interpreter after `statement` (this checkout first on the path)."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_engine_import_pulls_in_no_polars_and_no_hvd():
    mods = _modules_after("import avkit.runtime.engine")
    assert "avkit.runtime.engine" in mods
    assert not {m for m in mods if m == "polars" or m.startswith("polars.")}
    assert not {m for m in mods if m.startswith("avkit.hvd")}
    # estimators register by name only: none is imported until it is looked up
    assert not {m for m in mods if m.startswith("avkit.estimators.") and m.split(".")[-1] in
                ("online_logistic", "forgetting_logistic")}


def test_record_import_pulls_in_no_torch():
    """`avkit record` builds its requests before the engine loads: the package imports torch only when it runs."""
    mods = _modules_after("import avkit.record\nimport avkit.runtime.request")
    assert "avkit.record.recorder" in mods and "torch" not in mods


def test_looking_a_name_up_imports_its_module():
    mods = _modules_after("from avkit.estimators import ESTIMATORS\nESTIMATORS['forgetting_logistic']")
    assert "avkit.estimators.forgetting_logistic" in mods
    assert "avkit.estimators.coefficients" not in mods
    mods = _modules_after("from avkit.scheduling.spec import POLICIES\nPOLICIES['adaptive']")
    assert "avkit.scheduling.adaptive" in mods
    mods = _modules_after("from avkit.scheduling.spec import parse_spec\nparse_spec('adaptive-stop:qmax')")
    assert "torch" not in mods and "avkit.scheduling.adaptive" not in mods  # a spec parses without torch


def test_registry_entries():
    reg = Registry("widget", {"dumps": "json:dumps"})
    assert "dumps" in reg and "loads" not in reg and list(reg) == ["dumps"]
    assert reg["dumps"] is json.dumps
    reg.register("pair")(lambda a, b: (a, b))
    assert reg.make("pair", a=1, b=2) == (1, 2)
    with pytest.raises(ConfigError, match=r"unknown widget 'x'; choose from \['dumps', 'pair'\]"):
        reg.make("x")
    with pytest.raises(ModuleNotFoundError):
        Registry("widget", {"bad": "avkit.no_such_module:f"})["bad"]
