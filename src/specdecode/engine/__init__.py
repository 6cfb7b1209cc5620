"""The engine: one scheduler/step loop that every way in drives (the server, the Python API `LLM`,
the command line through it).

loop.py          Engine: queue, admit, prefill, one batched step (decoding/batch_decoder.py), k under
                 load, routing, accounting, delivery as events (Delta, Done, Failed); run by its own
                 thread (the server) or by the caller, one `iterate` at a time (LLM)
request.py       what goes in (Request) and comes out (events, Usage) of it
drafting.py      one drafter object per request, from templates built once per spec
load.py          measured verify cost at each batch size -> k under load
metrics.py       Prometheus counters/gauges/histograms, defined once; the /stats view
suffix_cache.py  suffix decoding's response caches: scopes, persistence, warming
per_spec.py      state kept per drafter spec, bounded whatever specs clients send
trace.py         per-step timings and rows, for finding where a gap comes from
client.py        driving it from the caller's thread: requests in, their events out (bench, train)
"""

from __future__ import annotations

from specdecode import drafters
from specdecode.backends.batch_model import batched
from specdecode.backends.models import LoadedModel
from specdecode.backends.precision import FP32, Precision
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.prefill import PREFILL_BUDGET
from specdecode.decoding.prefix_cache import PrefixCache
from specdecode.decoding.router import Router
from specdecode.decoding.taskstate import TaskState
from specdecode.engine.drafting import DrafterPool
from specdecode.engine.load import measure
from specdecode.engine.loop import Engine
from specdecode.engine.metrics import ServerMetrics
from specdecode.engine.request import (
    Collected,
    Delta,
    Done,
    Event,
    Failed,
    QueueFull,
    Request,
    RequestState,
    ShuttingDown,
    TooLarge,
    Usage,
)
from specdecode.engine.suffix_cache import SuffixCaches
from specdecode.engine.trace import StepTrace


def build_engine(
    target: LoadedModel,
    routes: SpecConfig,
    *,
    model_name: str,
    max_batch: int = 8,
    queue_size: int = 64,
    load_control: bool = True,
    precision: Precision = FP32,
    device: str | None = None,
    backend: str = "auto",
    drafter_quant: str = "none",
    threads: int | None = None,
    suffix_caches: SuffixCaches | None = None,
    prefill_budget: int = PREFILL_BUDGET,
    prefix_cache_mb: int = 256,
    kv_memory: int | None = None,
    kv_dtype: str = "auto",
    trace_steps: int = 0,
    learned_routing: bool = False,
    state: str | None = None,
    any_drafter: bool = False,
    chunked_prefill: bool = True,
    cost_k: int | None = None,
) -> Engine:
    """Everything the engine runs on: batched target (its KV cache within `kv_memory` bytes, default
    batch_model.kv_budget: blocks backed as they are written; at `kv_dtype`, batch_model.KV_DTYPES),
    drafters (model drafters loaded now; any_drafter: also those a request names later, as the Python
    API allows), the measured batch costs (one sequence's without load_control: they price
    stop=auto's rows, chain_stop.py) and the metrics (drafter labels from the
    configured routes); the router: `routes` per task, learned routing among their candidates, the per-task
    history in the `state` file; `trace_steps` > 0 keeps that many steps' timings (trace.py);
    chunked_prefill: prompts go in beside the others' steps (else each admission prefills at once);
    cost_k: the largest k whose verify cost is measured (None: the routes' largest, at most 8; beyond
    it the cost grows linearly)."""
    model = batched(target.model, max_batch, kv_memory, kv_dtype=kv_dtype)
    specs = {routes.default.drafter, *(r.drafter for r in routes.routing.values()), *routes.candidates}
    k_max = max([routes.default.k, *(r.k for r in routes.routing.values())])
    # without load control, one sequence's costs only: they price a chain's rows (stop=auto)
    costs = measure(model, max_batch if load_control else 1, cost_k or min(k_max, 8))
    pool = DrafterPool(
        drafters.DrafterContext(target, precision, device, backend, drafter_quant, rows=costs.rows),
        sorted(specs, key=str),
        suffix_caches,
        any_drafter=any_drafter,
    )
    return Engine(
        model,
        target.tokenizer,
        target.eos_ids,
        pool,
        ServerMetrics(model_name, specs),
        queue_size=queue_size,
        costs=costs,
        load_control=load_control,
        threads=threads,
        prefill_budget=prefill_budget,
        prefix_cache=PrefixCache(max_bytes=prefix_cache_mb << 20) if prefix_cache_mb > 0 else None,
        router=Router(routes, TaskState(state), auto=learned_routing),
        trace=StepTrace(trace_steps) if trace_steps else None,
        chunked_prefill=chunked_prefill,
    )


def default_routes(drafter: drafters.Spec, k: int, adaptive: bool) -> SpecConfig:
    return SpecConfig(default=Route(drafter, k, adaptive), candidates=[drafters.parse("none"), drafter])


__all__ = [
    "Collected",
    "Delta",
    "Done",
    "Engine",
    "Event",
    "Failed",
    "QueueFull",
    "Request",
    "RequestState",
    "ShuttingDown",
    "TooLarge",
    "Usage",
    "build_engine",
    "default_routes",
]
