"""Options several commands share, each declared once: its type and its help (the default is the command's
config's, `default_of`)."""

from __future__ import annotations

from typing import Annotated

import typer

TargetOption = Annotated[str, typer.Option(help="target model: alias, HF directory or GGUF file")]
DraftOption = Annotated[str, typer.Option(help="draft model ('none' = target-only decoding)")]
DrafterOption = Annotated[str, typer.Option(help="model | hybrid (suffix cache or draft model per step)")]
PayoffOption = Annotated[str, typer.Option(help="hybrid: payoff_mlp.pt (threshold) or payoff_survival.pt (cache and "
                                                "model drafts share one verification budget) from `avkit hvd` "
                                                "(default: ArcticInference's rule)")]
KernelsOption = Annotated[str, typer.Option(help="hot-path kernels: auto (Triton on CUDA, torch elsewhere) | torch | "
                                                 "triton (on a CPU: Triton's interpreter, TRITON_INTERPRET=1)")]
DeviceOption = Annotated[str, typer.Option(help="auto (a GPU if torch sees one) | cpu | cuda[:N]")]
DtypeOption = Annotated[str, typer.Option(help="model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | "
                                               "bfloat16 (~3x float32 on AVX512-BF16 CPUs)")]
EngineOption = Annotated[str, typer.Option(help="native (avkit's runtime) | vllm (vLLM's offline engine in its own "
                                                "venv, docs/vllm.md)")]
VllmPythonOption = Annotated[str, typer.Option(help="--engine vllm: that venv's python (default $AVKIT_VLLM_PYTHON, "
                                                    "else .venv-vllm/bin/python)")]

__all__ = ["DeviceOption", "DraftOption", "DrafterOption", "DtypeOption", "EngineOption", "KernelsOption",
           "PayoffOption", "TargetOption", "VllmPythonOption"]
