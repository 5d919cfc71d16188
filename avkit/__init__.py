"""avkit: adaptive verification for LLM speculative decoding."""

__version__ = "0.1.0"

from avkit.errors import AvkitError

__all__ = ["AvkitError", "__version__"]
