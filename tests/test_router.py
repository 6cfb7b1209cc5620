import pytest

from specdecode import drafters
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.control import AdaptiveK, CostModel
from specdecode.decoding.router import Router
from specdecode.decoding.taskstate import TaskState
from specdecode.drafters import parse

CHEAP = CostModel(0.0, {k: 1.0 + 0.01 * k for k in range(1, 9)}, step_s=0.001)


def router(target, config, **kw):
    return Router(target, config, drafters.DrafterContext(target), TaskState(), **kw)


def test_routes_by_task_label_and_classifier(target):
    cfg = SpecConfig(
        default=Route(parse("ngram:1-2"), 4, False),
        routing={"creative": Route(parse("none"), 1, False)},
        costs={parse("ngram:1-2"): CHEAP},
    )
    r = router(target, cfg)
    plain = r.run("Write a poem about the sea", max_new_tokens=8)  # classified creative -> none
    assert plain.extra["task"] == "creative" and plain.extra["drafter"] == "none" and plain.stats.drafted == 0
    coded = r.run("a b c a b c a b c", task="code", max_new_tokens=16)
    assert coded.extra["drafter"] == "ngram:1-2" and coded.stats.drafted > 0
    assert r.state.get("code", "ngram:1-2").requests == 1


def test_adaptive_route_uses_the_task_prior(target, monkeypatch):
    seen = {}
    real_init = AdaptiveK.__post_init__

    def spy(self):
        seen["prior"] = list(self.prior)
        real_init(self)

    monkeypatch.setattr(AdaptiveK, "__post_init__", spy)
    r = router(
        target, SpecConfig(default=Route(parse("ngram:1-2"), 4, True), costs={parse("ngram:1-2"): CHEAP})
    )
    r.run("a b c a b c a b c", task="code", max_new_tokens=16)
    assert seen["prior"] == [0.5]
    r.run("a b c a b c a b c", task="code", max_new_tokens=16)
    profile = r.state.get("code", "ngram:1-2").profile
    assert profile and seen["prior"] == pytest.approx(profile)


def test_auto_routing_explores_then_exploits(target):
    cfg = SpecConfig(
        default=Route(parse("ngram"), 4, False),
        candidates=[parse("none"), parse("ngram")],
        costs={parse("ngram"): CHEAP},
    )
    r = router(target, cfg, auto=True, explore=2)
    chosen = [r.run("x y z x y z x y z", task="sql", max_new_tokens=8).extra["drafter"] for _ in range(4)]
    ngram = "ngram:2-4"  # routes, state and results name a drafter by its canonical spec
    assert chosen[:2] == ["none", "none"] and chosen[2:4] == [ngram, ngram]
    # pretend ngram measured slower than plain on this task: auto routing must stop using it
    r.state.get("sql", ngram).speedup = 0.7
    assert r.run("x y z x y z", task="sql", max_new_tokens=4).extra["drafter"] == "none"
    r.state.get("sql", ngram).speedup = 1.4
    assert r.run("x y z x y z", task="sql", max_new_tokens=4).extra["drafter"] == ngram
