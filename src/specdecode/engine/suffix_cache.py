"""Suffix-decoding caches in the server: one per (drafter spec, scope), persisted and warmed.

A `suffix` drafter proposes from the responses of earlier requests (drafters/suffix.py). The server
keeps one SuffixCache per canonical spec and scope and hands it to every request of that scope:
- scope `global`: all requests share one cache;
- scope `key`: one per API key (hashed; requests without a key share one), so one tenant's traffic
  never shapes another's proposals;
- scope `user`: one per OpenAI `user` field (requests without one share one).
The engine runs every drafter call on its one thread, so the caches need no lock.
`--suffix-cache FILE` loads the caches at start and saves them at shutdown (written to a temporary
file and renamed: a crash leaves the old file). A file that cannot be read is a clear error at start,
and it is not overwritten. `--suffix-warm PATH` adds past responses to every new cache: a `train data`
directory, or a JSONL with `response_ids` (token ids) or `response` (text) per line.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from specdecode.drafters import SuffixCache
from specdecode.errors import UserError
from specdecode.files import write_atomic

SCOPES = ("global", "key", "user")
FORMAT = "specdecode-suffix-cache-1"


class SuffixCaches:
    def __init__(self, scope: str = "global", path: str | None = None, warm: list[list[int]] = ()):
        if scope not in SCOPES:
            raise UserError(f"--suffix-scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        self.scope, self.path, self.warm = scope, Path(path) if path else None, list(warm)
        self.caches: dict[tuple[str, str], SuffixCache] = {}
        self.saved: dict[tuple[str, str], list[list[int]]] = (
            self._load() if self.path and self.path.exists() else {}
        )

    def scope_key(self, authorization: str | None, user: str | None) -> str:
        """The scope a request's suffix cache belongs to."""
        if self.scope == "key":
            return hashlib.sha256((authorization or "").encode()).hexdigest()[:16]
        if self.scope == "user":
            return "user:" + (user or "")
        return ""

    def cache(self, spec: str, scope: str, like: SuffixCache) -> SuffixCache:
        """The cache of a canonical spec and scope (made like `like`, warmed, on first use): what a
        request's suffix drafter learns into (Drafter.fork's `learned`)."""
        key = (spec, scope)
        if key not in self.caches:
            cache = self.caches[key] = SuffixCache(like.trie.depth, like.max_requests)
            for tokens in self.warm + self.saved.pop(key, []):
                cache.extend(cache.new_key(), tokens)
        return self.caches[key]

    def snapshot(self, spec: str, scope: str) -> SuffixCache | None:
        """A copy of the cache of a canonical spec and scope as it is now (None: not made yet), for
        `restore` (bench: a run repeated under outside load must not propose from its own first answer)."""
        cache = self.caches.get((spec, scope))
        return None if cache is None else copy.deepcopy(cache)

    def restore(self, spec: str, scope: str, snapshot: SuffixCache | None) -> None:
        """Put back what `snapshot` took; requests forked from now on learn into it."""
        if snapshot is None:
            self.caches.pop((spec, scope), None)
        else:
            self.caches[(spec, scope)] = copy.deepcopy(snapshot)

    def save(self) -> None:
        if self.path is None:
            return
        entries = [
            {"spec": spec, "scope": scope, "responses": cache.responses()}
            for (spec, scope), cache in self.caches.items()
        ]
        entries += [
            {"spec": spec, "scope": scope, "responses": responses}  # loaded, not used this run
            for (spec, scope), responses in self.saved.items()
        ]
        text = json.dumps({"format": FORMAT, "caches": entries})
        write_atomic(self.path, lambda tmp: Path(tmp).write_text(text))

    def _load(self) -> dict[tuple[str, str], list[list[int]]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
            out = {}
            for entry in data["caches"]:
                responses = entry["responses"]
                if not all(
                    isinstance(r, list) and all(isinstance(t, int) and t >= 0 for t in r) for r in responses
                ):
                    raise ValueError("responses must be lists of token ids")
                out[(str(entry["spec"]), str(entry["scope"]))] = responses
            return out
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(
                f"suffix cache {self.path} cannot be read ({e}); it was left as it is: fix or move "
                "it, or start without --suffix-cache"
            ) from None
