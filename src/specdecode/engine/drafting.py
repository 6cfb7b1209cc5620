"""One drafter object per request, from drafters built once per spec.

Drafters may keep per-request state (begin/observe; a draft model keeps a KV cache), so each
request gets its own copy of the spec's template (Drafter.fork). Model-backed drafters
are loaded at start-up only: a request may name a weightless spec (`none`, `ngram[:MIN-MAX]`: built
on the spot, kept among a bounded few: per_spec.py) or a spec the server preloaded (kept for good).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from specdecode import drafters
from specdecode.engine.per_spec import PerSpec
from specdecode.engine.suffix_cache import SuffixCaches
from specdecode.errors import UserError


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
        self,
        ctx: drafters.DrafterContext,
        preload: Iterable[drafters.Spec] = (),
        caches: SuffixCaches | None = None,
        *,
        any_drafter: bool = False,
    ):
        """any_drafter: a request may name a model drafter not preloaded (loaded on first use, as the
        Python API allows); else only weightless ones (a server loads its drafters at start-up)."""
        self.ctx, self.any_drafter = ctx, any_drafter
        self.caches = caches or SuffixCaches()
        preload = list(preload)
        self.templates: PerSpec[drafters.Drafter] = PerSpec(preload)
        self.lock = threading.Lock()
        for spec in preload:
            self.template(spec, allow_load=True)

    def template(self, spec: drafters.Spec, allow_load: bool = False) -> drafters.Drafter:
        """The spec's drafter, built once (`ngram` and `ngram:2-4` are one spec, one template); every
        kind is servable: the batched core verifies trees and hands feature drafters their rows."""
        with self.lock:
            template = self.templates.get(spec)
            if template is None:
                if not spec.weightless and not (allow_load or self.any_drafter):
                    raise UserError(
                        f"drafter {str(spec)!r} is not loaded on this server; "
                        f"available: {', '.join(self.available())}"
                    )
                template = self.templates.put(spec, drafters.build(spec, self.ctx))
            return template

    @property
    def configured(self) -> frozenset[drafters.Spec]:
        """The specs the server was started with."""
        return self.templates.configured

    def available(self) -> list[str]:
        return sorted({str(spec) for spec in self.templates.configured} | set(_on_demand()))

    def instance(self, spec: drafters.Spec, scope: str = "") -> drafters.Drafter:
        """A drafter for one request; a suffix drafter gets the response cache of its spec and scope."""
        return self.template(spec).fork(lambda cache: self.caches.cache(str(spec), scope, cache))
