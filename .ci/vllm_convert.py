"""Convert the real pair's pinned GGUFs into HF safetensors directories for vLLM (which has no GGUF loader).

Usage (avkit's own Python; `just peer-vllm` runs it once):

    python .ci/vllm_convert.py             # -> $AVKIT_MODELS_DIR/<alias>-hf/ for both aliases (skips done ones)

transformers dequantizes the Q4_K/Q6_K blocks (``GgufConfig(dequantize=True)``) to float32; the model is
saved in bfloat16 (the same rounding avkit applies when it loads the GGUF with ``--dtype bfloat16``, so
both engines hold bit-identical weights). The quantizer must be cleared first, else ``save_pretrained``
refuses or writes a GGUF quantization config that vLLM then tries to honour. The tokenizer and chat
template come from the GGUF. Peak memory ~6 GB for the 1.5B target; each directory is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

from avkit.models.registry import PINNED, alias_path, models_dir


def hf_dir(alias: str) -> Path:
    """Where the converted directory of a pinned alias lives."""
    return models_dir() / f"{alias}-hf"


def convert(alias: str) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src, out = alias_path(alias), hf_dir(alias)
    if (out / "config.json").is_file():
        print(f"{alias}: {out} exists, skipped")
        return out
    if not src.is_file():
        sys.exit(f"avkit: error: {src}: GGUF missing (run `just models` first)")
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32,
        quantization_config=GgufConfig(gguf_file=src.name, dequantize=True))
    model = model.to(torch.bfloat16)
    model.hf_quantizer = None  # a dense model now: nothing to quantize on save or load
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.torch_dtype = torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    print(f"{alias}: wrote {out} in {time.perf_counter() - t0:.0f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("aliases", nargs="*", default=list(PINNED))
    args = ap.parse_args()
    for alias in args.aliases:
        if alias not in PINNED:
            sys.exit(f"avkit: error: alias {alias!r}: not one of {sorted(PINNED)}")
        convert(alias)


if __name__ == "__main__":
    main()
