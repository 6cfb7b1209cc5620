"""`specdecode serve`: an OpenAI-compatible server with batched speculative decoding.

backends/batch_model.py        many sequences in one target forward (ragged rows, per-slot KV)
decoding/batch_decoder.py      the decoding step for many sequences (decoding/step.py, shared with decoder.py)
engine.py                      continuous batching scheduler around it: queue, admit, k under load, deliver
load.py                        measured verify cost at each batch size -> k under load
drafting.py                    one drafter object per request
suffix_cache.py                suffix decoding's response caches: scopes, persistence, warming
lifecycle.py                   shutdown: drain, then fail what still runs (error event + [DONE], 503)
trace.py                       per-step timings and rows (--trace-steps), for finding where a gap comes from
metrics.py                     Prometheus counters/gauges/histograms, defined once; /stats view
schemas.py                     pydantic bodies, the OpenAI error body
app.py                         the routes; intake.py: a request checked -> the engine's Request;
                               answer.py: its samples submitted, streamed (SSE) or collected;
                               handlers.py: every error; guard.py: auth, body limit, request ids
"""

from __future__ import annotations

from specdecode import drafters
from specdecode.backends.batch_model import batched
from specdecode.backends.models import LoadedModel
from specdecode.backends.precision import FP32, Precision
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.prefill import PREFILL_BUDGET
from specdecode.decoding.prefix_cache import PrefixCache
from specdecode.server.drafting import DrafterPool
from specdecode.server.engine import Engine
from specdecode.server.load import measure
from specdecode.server.metrics import ServerMetrics
from specdecode.server.suffix_cache import SuffixCaches
from specdecode.server.trace import StepTrace


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
    kv_reserve: int = 0,
    trace_steps: int = 0,
) -> Engine:
    """Everything the server runs on: batched target (its KV cache sized for `kv_reserve` positions
    per slot now, else grown ahead of admitted requests without pausing the others), drafters (model
    drafters loaded now), the measured batch costs (when load_control) and the metrics (drafter labels
    from the configured routes); `trace_steps` > 0 keeps that many steps' timings (trace.py)."""
    model = batched(target.model, max_batch)
    if kv_reserve:
        model.reserve(kv_reserve)
    specs = {routes.default.drafter, *(r.drafter for r in routes.routing.values()), *routes.candidates}
    pool = DrafterPool(
        drafters.DrafterContext(target, precision, device, backend, drafter_quant),
        sorted(specs, key=str),
        suffix_caches,
    )
    k_max = max([routes.default.k, *(r.k for r in routes.routing.values())])
    costs = measure(model, max_batch, min(k_max, 8)) if load_control else None
    return Engine(
        model,
        target.tokenizer,
        target.eos_ids,
        pool,
        ServerMetrics(model_name, specs),
        queue_size=queue_size,
        costs=costs,
        threads=threads,
        prefill_budget=prefill_budget,
        prefix_cache=PrefixCache(max_bytes=prefix_cache_mb << 20) if prefix_cache_mb > 0 else None,
        k_for_batch=routes.k_for_batch if routes.k_by_batch_size else None,
        trace=StepTrace(trace_steps) if trace_steps else None,
    )


def default_routes(drafter: drafters.Spec, k: int, adaptive: bool) -> SpecConfig:
    return SpecConfig(default=Route(drafter, k, adaptive), candidates=[drafters.parse("none"), drafter])
