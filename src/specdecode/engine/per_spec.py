"""State the server keeps per drafter spec, bounded whatever specs clients send.

The specs the server was started with (its routes' and candidates') keep their entries for good; any
other spec a request names (`ngram:1-100000`, built on the spot) gets an entry among at most `others`,
the least recently written one giving way. So the state's size is set by the configuration, as the
metric labels are (metrics.DrafterLabels), and a client sending endless distinct specs cannot grow
it nor push out a configured drafter's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from specdecode.drafters.spec import Spec

V = TypeVar("V")

OTHERS = 16  # entries kept for specs the server was not started with


class PerSpec(Generic[V]):
    def __init__(self, configured: Iterable[Spec], others: int = OTHERS):
        self.configured = frozenset(configured)
        self.others = others
        self.pinned: dict[Spec, V] = {}
        self.recent: OrderedDict[Spec, V] = OrderedDict()

    def get(self, spec: Spec) -> V | None:
        """The spec's entry, or None; reading does not reorder (safe beside the writing thread)."""
        return self.pinned.get(spec, self.recent.get(spec))

    def put(self, spec: Spec, value: V) -> V:
        if spec in self.configured:
            self.pinned[spec] = value
        else:
            self.recent[spec] = value
            self.recent.move_to_end(spec)
            while len(self.recent) > self.others:
                self.recent.popitem(last=False)
        return value

    def setdefault(self, spec: Spec, make: Callable[[], V]) -> V:
        """The spec's entry, made by `make` when it has none (and counted as recently used)."""
        value = self.get(spec)
        return self.put(spec, make() if value is None else value)

    def pop(self, spec: Spec) -> V | None:
        return self.pinned.pop(spec) if spec in self.pinned else self.recent.pop(spec, None)

    def __len__(self) -> int:
        return len(self.pinned) + len(self.recent)

    def specs(self) -> list[Spec]:
        return [*self.pinned, *self.recent]
