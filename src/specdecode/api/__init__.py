"""The Python API: load a target with a drafter once, then generate, chat or stream.

    import specdecode
    llm = specdecode.LLM(drafter="ngram", k=4)            # default target: SmolLM2-135M-Instruct
    out = llm.generate(["The capital of France is"], specdecode.SamplingParams(temperature=0, max_tokens=8))
    out[0].text, out[0].metrics.acceptance_rate

llm.py          LLM: generate (many prompts batched through decoding/batch_decoder.py), chat, stream
params.py       SamplingParams (vLLM's names)
structured.py   StructuredOutputs: JSON schema, JSON object, regex or Lark grammar (vLLM's names)
outputs.py      RequestOutput / CompletionOutput (vLLM's shape) with per-request speculation stats
show.py         which tokens were accepted drafts: ANSI, plain markers, HTML
"""

from specdecode.api.llm import LLM
from specdecode.api.outputs import CompletionOutput, RequestOutput, StreamDelta
from specdecode.api.params import SamplingParams
from specdecode.api.structured import StructuredOutputs

__all__ = ["LLM", "SamplingParams", "StructuredOutputs", "RequestOutput", "CompletionOutput", "StreamDelta"]
