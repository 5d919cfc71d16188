"""Models: ``load(path_or_id)`` -> :class:`LoadedModel`, a Llama / Qwen2 checkpoint (HF directory or GGUF) in
avkit's compact forward (transformer.py) with its tokenizer; ``placement`` picks the device and dtype; ``load_pair`` loads a command's target and draft.
"""

from avkit.models.config import ModelConfig
from avkit.models.kv_cache import KVCache
from avkit.models.loader import LoadedModel, load, load_pair, placement
from avkit.models.tokenizer import Tokenizer
from avkit.models.transformer import HostLengths, Transformer

__all__ = ["HostLengths", "KVCache", "LoadedModel", "ModelConfig", "Tokenizer", "Transformer", "load", "load_pair",
           "placement"]
