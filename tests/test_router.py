"""Routing is a policy of the engine (decoding/router.py): a request's task picks its route from the
config, learned routing tries every candidate before keeping the fastest, and what finished requests
did seeds adaptive k. Checked through the Python API, the way in that drives the engine itself."""

import pytest

from specdecode import LLM, SamplingParams, StructuredOutputs
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.control import DEFAULT_PRIOR, AdaptiveK
from specdecode.decoding.router import Router
from specdecode.drafters import parse

GREEDY = SamplingParams(temperature=0, max_tokens=16)


def routed_llm(model_dir, tmp_path, config: SpecConfig, **kw) -> LLM:
    path = tmp_path / "config.json"
    config.save(path)
    return LLM(model_dir, config=str(path), dtype="fp32", **kw)


def test_routes_by_task_label_and_classifier(tiny_model_dir, tmp_path):
    llm = routed_llm(
        tiny_model_dir,
        tmp_path,
        SpecConfig(
            default=Route(parse("ngram:1-2"), 4, False), routing={"creative": Route(parse("none"), 1, False)}
        ),
    )
    plain = llm.generate("Write a poem about the sea", GREEDY)[0]  # classified creative -> none
    assert plain.route["task"] == "creative" and plain.route["drafter"] == "none"
    assert plain.metrics.drafted == 0 and plain.route["realised_speedup"] == 1.0
    coded = llm.generate("a b c a b c a b c", GREEDY, task="code")[0]
    assert coded.route["drafter"] == "ngram:1-2" and coded.metrics.drafted > 0
    assert llm.engine.router.state.get("code", "ngram:1-2").requests == 1


def test_routed_requests_batch_and_keep_their_own_routes(tiny_model_dir, tmp_path):
    """Prompts of different tasks go through the engine together, each on its own route, with the
    output each gets alone (greedy)."""
    llm = routed_llm(
        tiny_model_dir,
        tmp_path,
        SpecConfig(
            default=Route(parse("ngram"), 3, False), routing={"creative": Route(parse("none"), 1, False)}
        ),
    )
    prompts = ["Write a poem about the sea", "a b c a b c a b c", "def f(x): return x"]
    together = llm.generate(prompts, GREEDY)
    alone = [llm.generate(p, GREEDY)[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert {o.route["drafter"] for o in together} == {"none", "ngram:2-4"}


def test_structured_outputs_work_with_routing(tiny_model_dir, tmp_path):
    llm = routed_llm(tiny_model_dir, tmp_path, SpecConfig(default=Route(parse("ngram"), 3, True)))
    fmt = StructuredOutputs(regex="[ab]{3,6}")
    out = llm.generate("a b a b", SamplingParams(temperature=0, max_tokens=12, structured_outputs=fmt))[0]
    assert out.text and set(out.text) <= {"a", "b"} and 3 <= len(out.text) <= 6


def test_adaptive_route_uses_the_task_prior(tiny_model_dir, tmp_path, monkeypatch):
    seen = {}
    real_init = AdaptiveK.__post_init__

    def spy(self):
        seen["prior"] = list(self.prior)
        real_init(self)

    monkeypatch.setattr(AdaptiveK, "__post_init__", spy)
    llm = routed_llm(tiny_model_dir, tmp_path, SpecConfig(default=Route(parse("ngram:1-2"), 4, True)))
    llm.generate("a b c a b c a b c", GREEDY, task="code")
    assert seen["prior"] == list(DEFAULT_PRIOR)
    llm.generate("a b c a b c a b c", GREEDY, task="code")
    profile = llm.engine.router.state.get("code", "ngram:1-2").profile
    assert profile and seen["prior"] == pytest.approx(profile)


def test_auto_routing_explores_then_exploits(tiny_model_dir, tmp_path):
    config = SpecConfig(default=Route(parse("ngram"), 4, False), candidates=[parse("none"), parse("ngram")])
    llm = routed_llm(tiny_model_dir, tmp_path, config, routing="auto", state=str(tmp_path / "state.json"))
    short = SamplingParams(temperature=0, max_tokens=8)
    chosen = [llm.generate("x y z x y z x y z", short, task="sql")[0].route["drafter"] for _ in range(4)]
    ngram = "ngram:2-4"  # routes, state and results name a drafter by its canonical spec
    assert chosen == ["none", "none", ngram, ngram]
    state = llm.engine.router.state
    assert (tmp_path / "state.json").exists() and state.get("sql", ngram).requests == 2
    # pretend ngram measured slower than plain on this task: auto routing must stop using it
    state.get("sql", ngram).speedup = 0.7
    assert llm.generate("x y z x y z", short, task="sql")[0].route["drafter"] == "none"
    state.get("sql", ngram).speedup = 1.4
    assert llm.generate("x y z x y z", short, task="sql")[0].route["drafter"] == ngram


def test_the_router_alone_is_a_pure_policy():
    router = Router(
        SpecConfig(default=Route(parse("ngram"), 4, False), candidates=[parse("none")]), auto=True
    )
    assert router.choose("qa") == Route(parse("none"), 4, False)  # unexplored candidate first
    assert router.prior("qa", parse("ngram")) is None


def test_the_server_engine_routes_and_remembers_by_task(target, tmp_path):
    """`serve --routing auto --state F`: the engine the server runs chooses and learns the same way."""
    from specdecode.core.sampling import Warp
    from specdecode.decoding.taskstate import TaskState
    from specdecode.engine import Done, Request, build_engine

    config = SpecConfig(default=Route(parse("ngram"), 3, False), candidates=[parse("none"), parse("ngram")])
    path = tmp_path / "state.json"
    engine = build_engine(
        target, config, model_name="t", load_control=False, learned_routing=True, state=str(path)
    )
    route = engine.route("sql")
    assert route.drafter == parse("none")  # the first candidate is explored first
    events = []
    engine.submit(
        Request([5, 6, 7, 5, 6, 7], Warp(), 6, drafter=route.drafter, k=route.k, task="sql"), events.append
    )
    while engine.iterate():
        pass
    assert isinstance(events[-1], Done) and events[-1].route["drafter"] == "none"
    assert len(events[-1].tokens) == 6 and events[-1].stats.new_tokens == 6
    assert TaskState(path).get("sql", "none").requests == 1
