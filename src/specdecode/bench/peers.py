"""Hugging Face transformers as a peer in `specdecode bench`: the same HF module our backends wrap,
the same prompt token ids, the same greedy/sampling settings, through `model.generate`.

Peer specs (comma-separated in `bench --peers`):
- `hf`: plain `generate` (dynamic cache).
- `hf-lookup[:N]`: prompt lookup decoding, `prompt_lookup_num_tokens=N` (default 10, the value
  transformers' docs use; `max_matching_ngram_size` left at its default).
- `hf-assist[:DRAFTER]`: assisted generation with `assistant_model` = the HF module of our drafter
  DRAFTER (default `draft`, the shipped distilled draft model; any `draft:` spec works), with
  transformers' own assistant settings (its default, dynamic number of assistant tokens).
- `llamacpp[:FILE]`, `llamacpp-lookup[:N]`: llama.cpp on the target's GGUF file (bench/llamacpp.py).
HF reports no acceptance counts, so a peer's α and τ are left empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.core.metrics import Stats
from specdecode.core.sampling import Warp
from specdecode.decoding.generation import Result
from specdecode.errors import UserError

Peer = Callable[[list[int], int, Warp, int], Result]  # (ids, max_new_tokens, params, seed)


class _FirstTokenClock:
    """A generate() streamer that records when the first new token arrives (its first put() is the
    prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _runner(loaded, **generate_kwargs) -> Peer:
    hf = loaded.model.hf
    if any(p.numel() == 0 for p in hf.parameters()):  # --dtype gguf released the float32 linears
        raise UserError(
            "Hugging Face peers run the float32 or bf16 model: use them with --dtype fp32 or bf16, "
            "not gguf (bench --dtype fp32,gguf runs them in the fp32 pass only)"
        )
    eos = sorted(loaded.eos_ids)

    def run(ids: list[int], max_new_tokens: int, params: Warp, seed: int) -> Result:
        sampling = (
            {"do_sample": False}
            if params.temperature == 0
            else {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k or None,
            }
        )
        torch.manual_seed(seed)
        clock = _FirstTokenClock()
        input_ids = torch.tensor([ids], device=hf.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=eos[0],
                streamer=clock,
                **sampling,
                **generate_kwargs,
            )
        wall = time.perf_counter() - start
        new = out[0, len(ids) :].tolist()
        finish = "stop" if new and new[-1] in eos else "length"
        stats = Stats(
            prefills=1, new_tokens=len(new), wall_s=wall, ttft_s=(clock.first or time.perf_counter()) - start
        )
        return Result(
            loaded.tokenizer.decode(new, skip_special_tokens=True), new, stats, finish, prompt_tokens=len(ids)
        )

    return run


def _no_arg(arg: str | None):
    if arg:
        raise UserError(f"peer 'hf' takes no argument, got {arg!r}")


def _lookup_tokens(arg: str | None) -> int:
    try:
        n = int(arg) if arg else 10
    except ValueError:
        raise UserError(f"peer 'hf-lookup:N': N must be an integer, got {arg!r}") from None
    if n < 1:
        raise UserError(f"peer 'hf-lookup:N': N must be positive, got {n}")
    return n


def _assistant_spec(arg: str | None):
    """-> the assistant's drafter Spec (drafters.parse, the one validator of drafter specs)."""
    from specdecode.drafters import parse

    spec = parse(arg or "draft")
    if len(spec.draft_models) != 1 or spec.members:
        raise UserError(
            f"peer 'hf-assist:{spec}': the assistant must be a draft model spec (draft or draft:...)"
        )
    return spec


def _assist(spec, loaded, ctx) -> Peer:
    from specdecode import drafters

    return _runner(loaded, assistant_model=drafters.draft_model(spec, ctx).hf)


def _gguf_path(loaded, arg: str | None) -> Path:
    from specdecode.backends import models

    if arg:
        return Path(arg).expanduser()
    if not models.is_gguf(loaded.name):
        raise UserError(f"peer llamacpp: target {loaded.name} is not a GGUF file; name one: llamacpp:FILE")
    return models.resolve(loaded.name)


def _llamacpp(path_arg: str | None, lookup: int | None, loaded) -> Peer:
    from specdecode.bench import llamacpp

    return llamacpp.runner(_gguf_path(loaded, path_arg), lookup, loaded.eos_ids, loaded.tokenizer)


# name -> (argument parser, builder(parsed argument, loaded, ctx))
PEERS: dict[str, tuple[Callable, Callable]] = {
    "hf": (_no_arg, lambda _, loaded, ctx: _runner(loaded)),
    "hf-lookup": (_lookup_tokens, lambda n, loaded, ctx: _runner(loaded, prompt_lookup_num_tokens=n)),
    "hf-assist": (_assistant_spec, _assist),
    "llamacpp": (lambda arg: arg, lambda path, loaded, ctx: _llamacpp(path, None, loaded)),
    "llamacpp-lookup": (_lookup_tokens, lambda n, loaded, ctx: _llamacpp(None, n, loaded)),
}


@dataclass(frozen=True)
class PeerSpec:
    """A parsed peer spec: its text (the report's label), its name and its parsed argument."""

    text: str
    name: str
    arg: object

    def __str__(self) -> str:
        return self.text


def parse(text: str) -> PeerSpec:
    """A peer spec's text -> PeerSpec, parsed once where it enters (`bench --peers`); a drafter inside
    it (hf-assist:DRAFTER) is parsed by drafters.parse."""
    name, sep, arg = text.partition(":")
    if name not in PEERS:
        raise UserError(f"unknown peer {text!r}; known: {', '.join(PEERS)}")
    return PeerSpec(text, name, PEERS[name][0](arg if sep else None))


def build(spec: PeerSpec, loaded, ctx) -> Peer:
    """loaded: models.LoadedModel; ctx: drafters.DrafterContext (for hf-assist)."""
    return PEERS[spec.name][1](spec.arg, loaded, ctx)
