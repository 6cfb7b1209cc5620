"""Drafter specs parsed once: canonical strings, the facts other modules ask, and the one place
where `none` means k = 0."""

import pytest

from specdecode.drafters import KINDS, canonical, parse
from specdecode.errors import UserError


@pytest.mark.parametrize(
    "text,expected",
    [
        ("none", "none"),
        (" none ", "none"),
        ("ngram", "ngram:2-4"),
        ("ngram:02-4", "ngram:2-4"),
        ("ngram: 2-4", "ngram:2-4"),
        ("ngram:2-4:b=1", "ngram:2-4"),
        ("ngram:3-3", "ngram:3"),
        ("ngram:b=03:1-2", "ngram:1-2:b=3"),
        ("draft", "draft"),
        ("draft:/m", "draft:/m"),
        ("draft:nodes=8:b=2:/path:with:colons", "draft:b=2:nodes=8:/path:with:colons"),
        ("draft: b=2 :/m", "draft:b=2:/m"),
        ("draft:stop=auto:vocab=64:/m", "draft:vocab=64:stop=auto:/m"),
        ("draft: stop = 40 :/m", "draft:stop=40:/m"),
        ("medusa", "medusa"),
        ("eagle:b=2:nodes=6", "eagle:b=2:nodes=6"),
        ("ensemble:ngram+draft:/a+b", "ensemble:ngram:2-4+draft:/a+b"),
        ("fallback:ngram:k=03+eagle: k = 1", "fallback:ngram:2-4:k=3+eagle:k=1"),
        ("fallback:ngram+draft:b=2:/a+b:k=2", "fallback:ngram:2-4+draft:b=2:/a+b:k=2"),
    ],
)
def test_canonical_strings_round_trip(text, expected):
    assert canonical(text) == expected
    spec = parse(text)
    assert parse(str(spec)) == spec and str(spec) == expected
    assert hash(parse(expected)) == hash(spec)


def test_equal_drafters_compare_equal_whatever_the_spelling():
    assert parse("ngram") == parse("ngram:2-4") == parse("ngram:02-04:b=1")
    assert parse("ngram:2-5") != parse("ngram:2-4")
    assert parse("draft:b=2:/m") != parse("draft:/m")


@pytest.mark.parametrize(
    "text,weightless,trees,features,models,nodes",
    [
        ("none", True, False, False, (), 0),
        ("ngram", True, False, False, (), 4),
        ("ngram:b=3", True, True, False, (), 12),
        ("draft", False, False, False, (None,), 4),
        ("draft:/m", False, False, False, ("/m",), 4),
        ("draft:b=2:/m", False, True, False, ("/m",), 8),
        ("draft:b=2:nodes=10:/m", False, True, False, ("/m",), 10),
        ("medusa", False, False, True, (), 4),
        ("eagle:b=2:/d", False, True, True, (), 8),
        ("ensemble:ngram+draft:/m", False, True, False, ("/m",), 8),
        ("ensemble:ngram+ngram:1-2", True, True, False, (), 8),
        ("ensemble:ngram+eagle", False, True, True, (), 8),
        ("ensemble:ngram+eagle:k=1", False, True, True, (), 5),  # a member's cap bounds its nodes
        ("fallback:ngram+eagle:k=1", False, False, True, (), 4),  # one member drafts a step: the largest
        ("fallback:ngram+draft:b=2:/m:k=3", False, True, False, ("/m",), 6),
    ],
)
def test_facts(text, weightless, trees, features, models, nodes):
    spec = parse(text)
    assert (spec.weightless, spec.trees, spec.uses_features, spec.draft_models) == (
        weightless,
        trees,
        features,
        models,
    )
    assert spec.tree_nodes(4) == nodes


def test_a_members_cap_bounds_its_k():
    eagle = parse("fallback:ngram+eagle:k=1").members[1]
    assert (eagle.k(4), eagle.k(1), parse("eagle").k(4)) == (1, 1, 4)


def test_none_means_k_zero_and_nothing_else_does():
    assert parse("none").k(4) == 0 and not parse("none").speculates
    for text in ("ngram", "draft:/m", "medusa", "ensemble:ngram+ngram:1-2"):
        assert parse(text).k(4) == 4 and parse(text).speculates


@pytest.mark.parametrize(
    "text,message",
    [
        ("none:3", "none takes no argument"),
        ("ngram:0-2", "1 <= min_n"),
        ("ngram:4-2", "min_n"),
        ("ngram:1-2-3", "ngram argument"),
        ("draft:b=2", "needs a model"),
        ("medusa:nodes=4", "needs b=B"),
        ("draft:stop=most:/m", "stop needs an integer or auto, got 'most'"),
        ("draft:vocab=auto:/m", "vocab needs an integer, got 'auto'"),
        ("draft:stop=100:/m", "below 100"),
        ("draft:b=2:stop=auto:/m", "not a static one"),
        ("eagle:b=auto", "b needs an integer, got 'auto'"),
        ("ensemble:ngram+none", "cannot be 'none'"),
        ("fallback:ngram", "fallback needs two or more drafters"),
        ("fallback:ngram+eagle:k=0", "k=N needs N >= 1"),
        ("fallback:ngram+none", "fallback members cannot be 'none'"),
        (
            "eagle:k=1",
            "unknown eagle option 'k'",
        ),  # a cap belongs to a composite's member; --k sets a drafter's k
        (
            "oracle",
            "unknown drafter 'oracle'; known: none, ngram, draft, ensemble, fallback, medusa, eagle, suffix",
        ),
    ],
)
def test_bad_specs_are_refused_by_the_parser(text, message):
    with pytest.raises(UserError, match=message):
        parse(text)


def test_every_kind_has_a_vllm_exporter():
    """A new drafter kind must decide how (or that it cannot) be exported to vLLM."""
    from specdecode.export.vllm import EXPORTERS

    assert set(EXPORTERS) == set(KINDS)


def test_server_asks_the_spec_what_it_can_serve():
    from specdecode.engine.drafting import _on_demand

    assert _on_demand() == ["none", "ngram", "suffix"]  # weightless: built on first use, then shared


def test_the_engine_runs_none_with_k_zero_and_one_drafter_per_canonical_spec(target):
    """The engine asks the spec: `none` drafts nothing whatever k, adaptive or not; equal specs
    written differently share one drafter template."""
    from specdecode.core.sampling import Warp
    from specdecode.engine import Request, build_engine, default_routes

    engine = build_engine(
        target, default_routes(parse("ngram"), 4, False), model_name="t", load_control=False
    )
    none = engine._policy(Request([1, 2], Warp(), 4, drafter=parse("none"), k=4, adaptive=True))
    assert none.next_k() == 0
    assert engine._policy(Request([1, 2], Warp(), 4, drafter=parse("ngram"), k=4)).next_k() == 4
    assert engine.pool.template(parse("ngram")) is engine.pool.template(parse("ngram:02-4"))
