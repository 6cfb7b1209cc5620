"""Per-request control: the request's task picks a route (drafter + k), adaptive k runs inside
it, and the outcome feeds the per-task history that later requests (and restarts) start from.
"""

from __future__ import annotations

import logging

from specdecode import drafters
from specdecode.backends.models import LoadedModel
from specdecode.core.tasks import classify
from specdecode.decoding import costs
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.control import CostModel, FixedK, KPolicy, adaptive_k
from specdecode.decoding.generation import Result, encode_prompt, generate
from specdecode.decoding.taskstate import TaskState

log = logging.getLogger("specdecode.decoding.router")
PLAIN = drafters.parse("none")  # the route of plain decoding


class Router:
    def __init__(
        self,
        target: LoadedModel,
        config: SpecConfig,
        ctx: drafters.DrafterContext,
        state: TaskState | None = None,
        *,
        auto: bool = False,
        explore: int = 2,
    ):
        self.target, self.config, self.ctx = target, config, ctx
        self.state = state or TaskState()
        self.auto, self.explore = auto, explore
        self.drafters: dict[drafters.Spec, drafters.Drafter] = {}
        self.costs: dict[drafters.Spec, CostModel] = dict(config.costs)

    def drafter(self, spec: drafters.Spec) -> drafters.Drafter:
        if spec not in self.drafters:
            self.drafters[spec] = drafters.build(spec, self.ctx)
        return self.drafters[spec]

    def cost(self, spec: drafters.Spec, k_max: int, context: list[int]) -> CostModel:
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
            rec = self.state.get(task, str(spec))
            if rec is None or rec.requests < self.explore:
                return Route(spec, route.k, route.adaptive)
            speed = rec.speedup if rec.speedup is not None else 1.0
            if spec.speculates and speed > best_speed:
                best, best_speed = spec, speed
        return Route(best or PLAIN, route.k, route.adaptive)

    def policy(self, task: str, route: Route, cost: CostModel | None) -> KPolicy:
        """Fixed k (k = 0 for a drafter that never drafts), or adaptive k from the task's history."""
        spec = route.drafter
        if not route.adaptive or not spec.speculates:
            return FixedK(spec.k(route.k))
        rec = self.state.get(task, str(route.drafter))
        return adaptive_k(cost, route.k, rec.profile if rec else None, tracker=costs.CostTracker(cost))

    def run(
        self, prompt: str | list[int], *, task: str | None = None, chat: bool | None = None, **kw
    ) -> Result:
        """prompt: text (classified as it is when no task is given) or token ids."""
        tok = self.target.tokenizer
        task = task or classify(prompt if isinstance(prompt, str) else tok.decode(prompt))
        route = self.choose(task)
        ids = list(prompt) if isinstance(prompt, list) else encode_prompt(tok, prompt, chat)
        drafter = self.drafter(route.drafter)
        speculates = route.drafter.speculates
        cost = self.cost(route.drafter, route.k, ids) if speculates else None
        result = generate(self.target, drafter, ids, k=self.policy(task, route, cost), **kw)
        s = result.stats
        decode_s = s.draft_s + s.verify_s
        speedup = None
        if cost is not None and cost.step_s and decode_s > 0:
            speedup = s.new_tokens * cost.step_s / decode_s
        elif not speculates:
            speedup = 1.0
        self.state.observe(task, str(route.drafter), s, speedup)
        result.extra.update(
            task=task,
            drafter=str(route.drafter),
            k=route.k,
            adaptive=route.adaptive,
            realised_speedup=speedup,
        )
        return result
