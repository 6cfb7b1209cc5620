"""Per-spec server state (server/per_spec.py): configured specs kept for good, others in a small LRU."""

from __future__ import annotations

from specdecode.drafters import parse
from specdecode.engine.per_spec import PerSpec


def test_configured_specs_stay_and_other_specs_give_way_least_recently_written_first():
    configured = parse("ngram")
    state: PerSpec[int] = PerSpec([configured, parse("none")], others=3)
    state.put(configured, 1)
    odd = [parse(f"ngram:1-{100 + i}") for i in range(100)]
    for i, spec in enumerate(odd):
        state.put(spec, i)
    assert len(state) == 1 + 3 and state.get(configured) == 1
    assert [state.get(s) for s in odd[-3:]] == [97, 98, 99] and state.get(odd[0]) is None
    state.setdefault(odd[-3], lambda: -1)  # written again: the most recent now
    state.put(parse("ngram:1-9999"), 7)
    assert state.get(odd[-3]) == 97 and state.get(odd[-2]) is None
    assert state.setdefault(parse("none"), lambda: 5) == 5 and len(state) == 5  # configured: no limit
