"""Session-wide test setup.

Triton runs kernels on CPU only under its interpreter, and reads TRITON_INTERPRET when triton is
first imported; set it here, before any test module imports torch or triton, so the kernel tests
never skip because another module imported triton first. On a machine with a GPU it stays unset.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """`avkit ARGS...` in process -> (exit code, stdout, stderr)."""
    from avkit.cli import app

    try:
        app([str(a) for a in args], prog_name="avkit")
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def kernels():
    """The Triton kernels (interpreted on CPU), or a skip when triton is missing or was imported early."""
    pytest.importorskip("triton")
    import torch

    from avkit.errors import ConfigError
    from avkit.kernels.dispatch import select_kernels

    try:
        return select_kernels("cuda" if torch.cuda.is_available() else "cpu", backend="triton")
    except ConfigError as e:  # triton was imported earlier in this process without the interpreter
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: tiny models run ~10x faster single-threaded on a loaded 2-core box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The serve tests' tiny random pair: (target dir, draft dir, target, draft). The draft is the
    target's weights at a smaller init std (same seed), so acceptance is high but not 1 and every
    branch of verification runs."""
    import torch

    from avkit.models import load
    from avkit.models.testing import write_tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention
    root = tmp_path_factory.mktemp("serve_models")
    tpath = write_tiny_model(root / "target", vocab=384, seed=0, init_std=0.3)
    dpath = write_tiny_model(root / "draft", vocab=384, seed=0, init_std=0.25)
    yield tpath, dpath, load(tpath), load(dpath)
    torch.set_num_threads(threads)


def write_trace_pair(root, config, other_seed: int):
    """(root, one, two): two synthetic trace files in `root`, `config`'s and the same with `other_seed`
    (the provenance tests tell traces apart by their bytes)."""
    from dataclasses import replace

    from avkit.trace.synthetic import write_synthetic_trace

    one = write_synthetic_trace(root / "one.parquet", config)
    return root, one, write_synthetic_trace(root / "two.parquet", replace(config, seed=other_seed))
