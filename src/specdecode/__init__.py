"""specdecode: speculative decoding of causal language models."""

from specdecode.errors import UserError

__all__ = ["UserError"]
__version__ = "0.1.0"
