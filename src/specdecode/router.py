"""Per-request control: the request's task picks a route (drafter + k), adaptive k runs inside
it, and the outcome feeds the per-task history that later requests (and restarts) start from.
"""

from __future__ import annotations

import logging

from specdecode import costs, drafters
from specdecode.config import Route, SpecConfig
from specdecode.control import AdaptiveK, CostModel
from specdecode.generation import Result, encode_prompt, generate
from specdecode.models import LoadedModel
from specdecode.tasks import classify
from specdecode.taskstate import TaskState

log = logging.getLogger("specdecode.router")


class Router:
    def __init__(self, target: LoadedModel, config: SpecConfig, ctx: drafters.DrafterContext,
                 state: TaskState | None = None, *, auto: bool = False, explore: int = 2):
        self.target, self.config, self.ctx = target, config, ctx
        self.state = state or TaskState()
        self.auto, self.explore = auto, explore
        self.drafters: dict[str, drafters.Drafter] = {}
        self.costs: dict[str, CostModel] = dict(config.costs)

    def drafter(self, spec: str) -> drafters.Drafter:
        if spec not in self.drafters:
            self.drafters[spec] = drafters.build(spec, self.ctx)
        return self.drafters[spec]

    def cost(self, spec: str, k_max: int, context: list[int]) -> CostModel:
        """The measured cost model of a drafter (measured once, then refreshed online)."""
        known = self.costs.get(spec)
        if known is None or max(known.verify_ratio, default=0) < k_max:
            self.costs[spec] = costs.measure(self.target.model, self.drafter(spec), k_max, context)
        return self.costs[spec]

    def choose(self, task: str) -> Route:
        route = self.config.route(task)
        if not self.auto:
            return route
        # learned routing: try every candidate a few times on this task, then keep the best one
        best, best_speed = None, 1.0
        for spec in self.config.candidates:
            rec = self.state.get(task, spec)
            if rec is None or rec.requests < self.explore:
                return Route(spec, route.k, route.adaptive)
            speed = rec.speedup if rec.speedup is not None else 1.0
            if spec != "none" and speed > best_speed:
                best, best_speed = spec, speed
        return Route(best or "none", route.k, route.adaptive)

    def run(self, prompt: str, *, task: str | None = None, chat: bool | None = None, **kw) -> Result:
        task = task or classify(prompt)
        route = self.choose(task)
        ids = encode_prompt(self.target.tokenizer, prompt, chat)
        drafter = self.drafter(route.drafter)
        cost = self.cost(route.drafter, route.k, ids) if route.drafter != "none" else None
        k = route.k
        if route.drafter == "none":
            k = 1  # the none drafter proposes nothing whatever k is
        elif route.adaptive:
            rec = self.state.get(task, route.drafter)
            prior = rec.profile if rec and rec.profile else [0.5]
            k = AdaptiveK(cost, route.k, prior=prior, tracker=costs.CostTracker(cost))
        result = generate(self.target, drafter, ids, k=k, **kw)
        s = result.stats
        decode_s = s.draft_s + s.verify_s
        speedup = None
        if cost is not None and cost.step_s and decode_s > 0:
            speedup = s.new_tokens * cost.step_s / decode_s
        elif route.drafter == "none":
            speedup = 1.0
        self.state.observe(task, route.drafter, s, speedup)
        result.extra.update(task=task, drafter=route.drafter, k=route.k, adaptive=route.adaptive,
                            realised_speedup=speedup)
        return result
