"""A client that drives the engine from its own thread, for the tools that measure or produce data
with it (bench, advise, train data, train prompts): submit requests, run `Engine.iterate`, collect
each request's events. The Python API (api/llm.py) does the same with streaming on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from specdecode import drafters
from specdecode.backends.models import LoadedModel
from specdecode.decoding.config import Route, SpecConfig
from specdecode.engine import build_engine
from specdecode.engine.loop import Engine
from specdecode.engine.request import Collected, Request
from specdecode.engine.suffix_cache import SuffixCaches


def complete(
    engine: Engine, requests: Iterable[Request], window: int = 1
) -> Iterator[tuple[Request, Collected]]:
    """Each request with its events once it finished, in order of completion. At most `window`
    requests are in the engine at once (1: one at a time, so each is timed alone; more: they decode
    together in its batches). Requests are drawn as room frees up, so a caller may stop feeding them
    (a deadline); a request that fails raises its error."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    queue, running = iter(requests), []
    while True:
        while len(running) < window and (request := next(queue, None)) is not None:
            collected = Collected()
            engine.submit(request, collected.add)
            running.append((request, collected))
        if not running:
            return
        worked = engine.iterate()
        for request, collected in list(running):
            collected.check()
            if collected.finished:
                running.remove((request, collected))
                yield request, collected
        if not worked and running:
            raise RuntimeError("the engine has no work but requests are unfinished")


def alone(engine: Engine, request: Request) -> Collected:
    """One request through the engine with nothing else in it: its events."""
    ((_, collected),) = complete(engine, [request])
    return collected


def measuring_engine(
    target: LoadedModel,
    ctx: drafters.DrafterContext,
    specs: Iterable[drafters.Spec],
    k_max: int,
    *,
    max_batch: int = 1,
    suffix_caches: SuffixCaches | None = None,
    name: str = "bench",
) -> Engine:
    """An engine for measuring requests run alone (bench, advise): every drafter of `specs` loaded
    now, verify costs measured up to k_max at batch sizes up to max_batch, no prefix cache (every
    request prefills its own prompt, as a first request does), each prompt prefilled at once as the
    Python API and the CLI do. Every request names its own drafter and k."""
    plain = drafters.parse("none")
    return build_engine(
        target,
        SpecConfig(default=Route(plain, 1, False), candidates=sorted({plain, *specs}, key=str)),
        model_name=name,
        max_batch=max_batch,
        precision=ctx.precision,
        device=ctx.device,
        backend=ctx.backend,
        drafter_quant=ctx.quant,
        suffix_caches=suffix_caches,
        prefix_cache_mb=0,
        chunked_prefill=False,
        cost_k=k_max,
    )
