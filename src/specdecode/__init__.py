"""specdecode: speculative decoding of causal language models.

`specdecode.LLM`, `specdecode.SamplingParams`, `specdecode.StructuredOutputs` and the output types
(api/) load torch on first use, so that `import specdecode` (and the command line's start) stays fast.
"""

from specdecode.errors import UserError

__all__ = [
    "UserError",
    "LLM",
    "SamplingParams",
    "StructuredOutputs",
    "RequestOutput",
    "CompletionOutput",
    "StreamDelta",
]
__version__ = "0.1.0"

_API = {"LLM", "SamplingParams", "StructuredOutputs", "RequestOutput", "CompletionOutput", "StreamDelta"}


def __getattr__(name: str):
    if name in _API:
        from specdecode import api

        return getattr(api, name)
    raise AttributeError(f"module 'specdecode' has no attribute {name!r}")
