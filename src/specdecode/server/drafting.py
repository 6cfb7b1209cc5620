"""One drafter object per request, from drafters built once per spec.

Drafters may keep per-request state (begin/observe; a draft model keeps a KV cache), so each
request gets its own copy of the spec's template (Drafter.fork). Model-backed drafters
are loaded at start-up only: a request may name a weightless spec (`none`, `ngram[:MIN-MAX]`: built
on the spot) or a spec the server preloaded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from specdecode import drafters
from specdecode.errors import UserError
from specdecode.server.suffix_cache import SuffixCaches


def check_servable(text: str) -> drafters.Spec:
    """Parse a drafter spec before anything is loaded (a malformed one is a clear error). Every
    drafter kind is servable: the batched core verifies token trees and hands feature drafters their rows."""
    return drafters.parse(text)


def _on_demand() -> list[str]:
    """Kinds a request may name without a preload: the weightless ones."""
    out = []
    for name, kind in drafters.KINDS.items():
        try:
            spec = kind.parse(None)
        except UserError:  # needs an argument (ensemble)
            continue
        if spec.weightless:
            out.append(name)
    return out


class DrafterPool:
    def __init__(
        self, ctx: drafters.DrafterContext, preload: Iterable[str] = (), caches: SuffixCaches | None = None
    ):
        self.ctx = ctx
        self.caches = caches or SuffixCaches()
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
                    raise UserError(
                        f"drafter {text!r} is not loaded on this server; "
                        f"available: {', '.join(self.available())}"
                    )
                self.templates[key] = drafters.build(spec, self.ctx)
            return self.templates[key]

    def available(self) -> list[str]:
        return sorted(set(self.templates) | set(_on_demand()))

    def instance(self, spec: str, scope: str = "") -> drafters.Drafter:
        """A drafter for one request; a suffix drafter gets the response cache of its spec and scope."""
        key = str(drafters.parse(spec))
        return self.template(spec).fork(lambda cache: self.caches.cache(key, scope, cache))
