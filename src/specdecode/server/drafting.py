"""One drafter object per request, from drafters built once per spec.

Drafters may keep per-request state (begin/observe; a draft model keeps a KV cache), so each
request gets a shallow copy of the spec's template; a draft model's copy gets a cache of its own
over the shared weights. Model-backed drafters are loaded at start-up only: a request may name
a weightless spec (`none`, `ngram[:MIN-MAX]`: built on the spot) or a spec the server preloaded.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable

from specdecode import drafters
from specdecode.errors import UserError
from specdecode.fast_llama import FastLlama
from specdecode.models import CausalLM

def check_servable(text: str) -> drafters.Spec:
    """Refuse drafters the batched server cannot run, with the reason, before anything is loaded."""
    spec = drafters.parse(text)
    # the batched forward neither returns the target's hidden states nor verifies trees (yet)
    why = ("needs the target's hidden states" if spec.uses_features else
           "proposes token trees" if spec.trees else None)
    if why:
        raise UserError(f"drafter {text!r} {why}, which `specdecode serve` does not support yet; "
                        "use none, ngram or draft:<model> (chains)")
    return spec


def fork(model: CausalLM) -> CausalLM:
    """The same weights with an empty KV cache of its own."""
    twin = copy.copy(model)
    if isinstance(twin, FastLlama):
        twin.k_cache = twin.v_cache = None
    twin.reset()  # HFModel: a new DynamicCache
    return twin


def _on_demand() -> list[str]:
    """Kinds a request may name without a preload: weightless and servable in their plain form."""
    out = []
    for name, kind in drafters.KINDS.items():
        try:
            spec = kind.parse(None)
        except UserError:  # needs an argument (ensemble)
            continue
        if spec.weightless and not spec.trees and not spec.uses_features:
            out.append(name)
    return out


class DrafterPool:
    def __init__(self, ctx: drafters.DrafterContext, preload: Iterable[str] = ()):
        self.ctx = ctx
        self.templates: dict[str, drafters.Drafter] = {}
        self.lock = threading.Lock()
        for spec in preload:
            self.template(spec, allow_load=True)

    def template(self, text: str, allow_load: bool = False) -> drafters.Drafter:
        spec = check_servable(text)
        key = str(spec)  # `ngram` and `ngram:2-4` share one template
        with self.lock:
            if key not in self.templates:
                if not spec.weightless and not allow_load:
                    raise UserError(f"drafter {text!r} is not loaded on this server; "
                                    f"available: {', '.join(self.available())}")
                self.templates[key] = drafters.build(spec, self.ctx)
            return self.templates[key]

    def available(self) -> list[str]:
        return sorted(set(self.templates) | set(_on_demand()))

    def instance(self, spec: str) -> drafters.Drafter:
        drafter = copy.copy(self.template(spec))
        model = getattr(drafter, "model", None)  # a draft model: give this request its own cache
        if model is not None:
            drafter.model = fork(model)
        return drafter
