"""llama.cpp (through llama-cpp-python, an optional extra) as a peer in `specdecode bench`: the
same GGUF file as our target (or another named one), the same prompt token ids, greedy, the same
thread count.

- `llamacpp[:FILE]`: plain decoding.
- `llamacpp-lookup[:N]`: its prompt lookup decoding (LlamaPromptLookupDecoding, N draft tokens,
  default 10), which needs `logits_all=True` (without it, it crashed past 512 context tokens).
Extra weight buffers are off (`use_extra_bufts=False`, llama.cpp's --no-repack): on AMX machines its
repacked Q4_1 matmul crashed. Greedy only: llama.cpp's samplers are not ours, so sampled runs would
not compare. llama.cpp reports no acceptance counts; α and τ stay empty.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specdecode.core.metrics import Stats
from specdecode.decoding.generation import Result
from specdecode.errors import UserError


def _llama(path: Path, lookup: int | None):
    try:
        import llama_cpp
    except ImportError:
        raise UserError(
            "peer llamacpp needs llama-cpp-python: CMAKE_ARGS='-DGGML_NATIVE=ON' pip install "
            "llama-cpp-python (a ~12-minute source build on 2 cores)"
        ) from None
    draft = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    kwargs = {"use_extra_bufts": False}
    try:
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=4096,
            n_threads=torch.get_num_threads(),
            n_threads_batch=torch.get_num_threads(),
            logits_all=bool(lookup),
            draft_model=draft,
            verbose=False,
            **kwargs,
        )
    except TypeError:  # an older llama-cpp-python without use_extra_bufts
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=4096,
            n_threads=torch.get_num_threads(),
            n_threads_batch=torch.get_num_threads(),
            logits_all=bool(lookup),
            draft_model=draft,
            verbose=False,
        )


def runner(path: Path, lookup: int | None, eos_ids: set[int], tokenizer):
    """-> a bench Peer: (ids, max_new_tokens, params, seed) -> Result, greedy on llama.cpp."""
    if not path.is_file() or path.suffix != ".gguf":
        raise UserError(f"peer llamacpp needs a .gguf file; {path} is not one")
    llm = _llama(path, lookup)

    def run(ids: list[int], max_new_tokens: int, params, seed: int) -> Result:
        if params.temperature != 0:
            raise UserError("peer llamacpp runs greedy only (--temperature 0)")
        llm.reset()
        new, first = [], None
        start = time.perf_counter()
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            first = first or time.perf_counter()
            new.append(int(token))
            if token in eos_ids or len(new) >= max_new_tokens:
                break
        wall = time.perf_counter() - start
        finish = "stop" if new and new[-1] in eos_ids else "length"
        stats = Stats(
            prefills=1, new_tokens=len(new), wall_s=wall, ttft_s=(first or time.perf_counter()) - start
        )
        return Result(
            tokenizer.decode(new, skip_special_tokens=True), new, stats, finish, prompt_tokens=len(ids)
        )

    return run
