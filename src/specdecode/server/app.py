"""HTTP layer: OpenAI-compatible routes, server-sent events, auth, body limit, errors.

Routes: POST /v1/completions, POST /v1/chat/completions (both with `stream`), GET /v1/models,
/health, /metrics (Prometheus text), /stats (JSON), /stats/steps (the step trace, with --trace-steps).
/v1/* and /stats* need the API key when one
is set; /health and /metrics stay open for probes and scrapers.

The pieces: intake.py checks a request and makes the engine's Request, answer.py submits its samples
and streams or collects their events, handlers.py answers every error, guard.py (around the app)
checks the key and the body's size.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response

from specdecode import engine as eng
from specdecode.server.answer import answer
from specdecode.server.guard import Guard, request_id
from specdecode.server.handlers import install_error_handlers
from specdecode.server.intake import Intake
from specdecode.server.responses import ChatFormat, CompletionFormat
from specdecode.server.schemas import ApiError, ChatRequest, CompletionRequest


@dataclass
class AppOptions:
    model_name: str
    api_key: str | None = None
    timeout_s: float | None = None  # serve --timeout; None: no limit
    max_body_bytes: int = 1 << 20


def create_app(engine: eng.Engine, opts: AppOptions, *, start_engine: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        if start_engine:
            engine.start()
        yield
        engine.stop()  # in-flight requests have finished (uvicorn waits for them) or are failed now
        engine.pool.caches.save()  # --suffix-cache: atomically

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    _add_generation_routes(app, engine, opts)
    _add_status_routes(app, engine, opts)
    return Guard(app, opts.api_key, opts.max_body_bytes)


def _add_generation_routes(app: FastAPI, engine: eng.Engine, opts: AppOptions) -> None:
    """POST /v1/completions and /v1/chat/completions: a prompt's token ids and the text its task is
    classified from, then intake and answer."""
    tokenizer, vocab = engine.tokenizer, engine.model.vocab_size
    intake = Intake(engine, opts.model_name, opts.timeout_s)

    def token_text(token: int) -> str:
        return tokenizer.decode([token])

    async def run(request: Request, req, ids: list[int], task_text: str, fmt: CompletionFormat):
        template = intake.request(req, ids, task_text, request_id(request.scope))
        template.scope = engine.pool.caches.scope_key(request.headers.get("authorization"), req.user)
        return await answer(engine, request, template, req, fmt)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        prompt = req.prompt
        ids = list(prompt) if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]
        if any(t >= vocab for t in ids):  # before decoding them for the task classifier
            raise ApiError(400, f"token ids must be in [0, {vocab})", param="prompt")
        text = prompt if isinstance(prompt, str) else tokenizer.decode(ids)
        return await run(request, req, ids, text, CompletionFormat(opts.model_name, token_text, req.n))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model has no chat template; use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # templates raise on role orders they do not support
            raise ApiError(400, f"chat template failed: {e}", param="messages") from None
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        users = [m["content"] for m in messages if m["role"] == "user"]
        return await run(
            request,
            req,
            ids,
            users[-1] if users else messages[-1]["content"],
            ChatFormat(opts.model_name, token_text, req.n),
        )


def _add_status_routes(app: FastAPI, engine: eng.Engine, opts: AppOptions) -> None:
    """GET /v1/models, /health (GET and HEAD), /metrics, /stats and /stats/steps."""
    context = engine.model.max_length

    @app.get("/v1/models")
    async def list_models():
        return {
            "object": "list",
            "data": [
                {
                    "id": opts.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "specdecode",
                    "max_model_len": context,
                }
            ],
        }

    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with HEAD
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(
            engine.metrics.prometheus_text(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/stats")
    async def stats():
        return engine.metrics.stats()

    @app.get("/stats/steps")
    async def steps():
        if engine.trace is None:
            raise ApiError(404, "no step trace: start the server with --trace-steps N", "not_found_error")
        return engine.trace.to_json()
