"""Start-up hygiene: `avkit --version`, every `-h` and every argument error import no torch, polars or
matplotlib (the commands import them when they run). A fresh interpreter per check; no timing asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torch", "polars", "matplotlib")

# run in a fresh interpreter: every command path's `-h`, then the argument errors, then the heavy modules seen
_PROBE = """
import json, sys
import typer.main
from avkit.cli import app

cmd = typer.main.get_command(app)


def walk(c, path):
    yield path
    for name, sub in getattr(c, "commands", {}).items():
        yield from walk(sub, path + [name])


def run(args):
    try:
        app(args, prog_name="avkit")  # as `avkit ...` runs: AvkitError -> one line, exit 2
    except SystemExit as e:
        return e.code
    return 0


codes = {" ".join(p + ["-h"]): run(p + ["-h"]) for p in walk(cmd, [])}
codes["--version"] = run(["--version"])
for args in json.loads(sys.argv[1]):
    codes[" ".join(args)] = run(args)
print(json.dumps({"codes": codes, "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))

# argument errors: each is refused before the command imports what its work needs
ERRORS = [
    ["fit", "--mode", "nope"],
    ["simulate", "--concurrency", "-4"],
    ["tune", "--concurrency", "1,x"],
    ["report", "--bins", "1"],
    ["record", "--concurrency", "0"],
    ["serve", "--port", "-1"],
    ["serve", "--policy", "nope"],  # a policy spec parses without torch (scheduling/spec.py)
    ["simulate", "--policy", "fixed:x"],
    ["record", "--policy", "adaptive-sometimes"],
    ["profile", "--repeats", "0"],
    ["hvd", "--epochs", "0"],
]


def test_help_version_and_argument_errors_import_no_heavy_library(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(ERRORS)], capture_output=True, text=True,
                         cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    codes = result["codes"]
    assert {"record -h", "fit -h", "simulate -h", "tune -h", "report -h", "serve -h", "models list -h"} <= set(codes)
    assert all(code == 0 for args, code in codes.items() if args.endswith("-h") or args == "--version"), codes
    assert all(codes[" ".join(args)] == 2 for args in ERRORS), codes
    assert result["heavy"] == [], result
