"""Per-request routing, a policy of the engine (engine/loop.py): a request's task picks a route
(drafter + k) from the configuration, or, with learned routing, among the candidates by their
measured speedup on that task; what each finished request did feeds the per-task history
(taskstate.py) that later routing, adaptive k's prior and restarts start from.
"""

from __future__ import annotations

from specdecode.core.metrics import Stats
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.taskstate import TaskState
from specdecode.drafters.spec import Spec, parse

PLAIN = parse("none")  # the route of plain decoding


class Router:
    """config: routes per task and the candidates of learned routing; state: the per-task history
    (persisted when it has a path); auto: learned routing, trying every candidate `explore` times on a
    task before keeping the fastest (plain decoding unless a drafter measured faster than it)."""

    def __init__(
        self, config: SpecConfig, state: TaskState | None = None, *, auto: bool = False, explore: int = 2
    ):
        self.config, self.state = config, state or TaskState()
        self.auto, self.explore = auto, explore

    def choose(self, task: str) -> Route:
        route = self.config.route(task)
        if not self.auto:
            return route
        best, best_speed = None, 1.0
        for spec in self.config.candidates:
            rec = self.state.get(task, str(spec))
            if rec is None or rec.requests < self.explore:
                return Route(spec, route.k, route.adaptive)
            speed = rec.speedup if rec.speedup is not None else 1.0
            if spec.speculates and speed > best_speed:
                best, best_speed = spec, speed
        return Route(best or PLAIN, route.k, route.adaptive)

    def prior(self, task: str, spec: Spec) -> list[float] | None:
        """The drafter's per-position acceptance on this task so far (adaptive k's prior), if any."""
        rec = self.state.get(task, str(spec))
        return rec.profile if rec is not None and rec.profile else None

    def observe(self, task: str, spec: Spec, stats: Stats, step_s: float | None) -> float | None:
        """One finished request -> its realised speedup over plain decoding (None when unknown), kept
        in the task's history. step_s: the measured time of a plain decoding step."""
        decode_s = stats.draft_s + stats.verify_s
        if not spec.speculates:
            speedup = 1.0
        elif step_s and decode_s > 0:
            speedup = stats.new_tokens * step_s / decode_s
        else:
            speedup = None
        self.state.observe(task, str(spec), stats, speedup)
        self.state.save()
        return speedup
