"""One drafter object per request, from drafters built once per spec.

Drafters may keep per-request state (begin/observe; a draft model keeps a KV cache), so each
request gets a shallow copy of the spec's template; a draft model's copy gets a cache of its own
over the shared weights. Model-backed drafters are loaded at start-up only: a request may name
`none`, `ngram[:MIN-MAX]` (built on the spot, no weights) or a spec the server preloaded.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable

from specdecode import drafters
from specdecode.errors import UserError
from specdecode.fast_llama import FastLlama
from specdecode.models import CausalLM

_WEIGHTLESS = ("none", "ngram")
# the batched forward neither captures the target's hidden states nor verifies trees (yet)
_NOT_SERVABLE = {"medusa": "needs the target's hidden states", "eagle": "needs the target's hidden states",
                 "ensemble": "proposes token trees"}


def check_servable(spec: str) -> None:
    """Refuse drafters the batched server cannot run, with the reason, before anything is loaded."""
    name = drafters.check_spec(spec)
    tree = any(part.startswith("b=") for part in spec.split(":")[1:])  # ngram:b=B, draft:b=B:...
    why = _NOT_SERVABLE.get(name) or ("proposes token trees" if tree else None)
    if why:
        raise UserError(f"drafter {spec!r} {why}, which `specdecode serve` does not support yet; "
                        "use none, ngram or draft:<model> (chains)")


def fork(model: CausalLM) -> CausalLM:
    """The same weights with an empty KV cache of its own."""
    twin = copy.copy(model)
    if isinstance(twin, FastLlama):
        twin.k_cache = twin.v_cache = None
    twin.reset()  # HFModel: a new DynamicCache
    return twin


class DrafterPool:
    def __init__(self, ctx: drafters.DrafterContext, preload: Iterable[str] = ()):
        self.ctx = ctx
        self.templates: dict[str, drafters.Drafter] = {}
        self.lock = threading.Lock()
        for spec in preload:
            self.template(spec, allow_load=True)

    def template(self, spec: str, allow_load: bool = False) -> drafters.Drafter:
        with self.lock:
            if spec not in self.templates:
                name = drafters.check_spec(spec)
                check_servable(spec)
                if name not in _WEIGHTLESS and not allow_load:
                    raise UserError(f"drafter {spec!r} is not loaded on this server; "
                                    f"available: {', '.join(self.available())}")
                self.templates[spec] = drafters.build(spec, self.ctx)
            return self.templates[spec]

    def available(self) -> list[str]:
        return sorted(set(self.templates) | set(_WEIGHTLESS))

    def instance(self, spec: str) -> drafters.Drafter:
        drafter = copy.copy(self.template(spec))
        model = getattr(drafter, "model", None)  # a draft model: give this request its own cache
        if model is not None:
            drafter.model = fork(model)
        return drafter
