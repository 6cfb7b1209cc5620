"""HTTP layer: OpenAI-compatible routes, server-sent events, auth, body limit, errors.

Routes: POST /v1/completions, POST /v1/chat/completions (both with `stream`), GET /v1/models,
/health, /metrics (Prometheus text), /stats (JSON), /stats/steps (the step trace, with --trace-steps).
/v1/* and /stats* need the API key when one
is set; /health and /metrics stay open for probes and scrapers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from specdecode.api.structured import StructuredOutputs
from specdecode.core.sampling import Warp
from specdecode.core.tasks import classify
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.penalties import Penalties
from specdecode.drafters import parse
from specdecode.errors import UserError
from specdecode.server import engine as eng
from specdecode.server.guard import Guard, request_id
from specdecode.server.responses import ChatFormat, CompletionFormat, merge_usage
from specdecode.server.schemas import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    ResponseFormat,
    Speculative,
    error_response,
)

log = logging.getLogger(__name__)


@dataclass
class AppOptions:
    model_name: str
    routes: SpecConfig  # default drafter/k/adaptive, and routes per task
    api_key: str | None = None
    timeout_s: float | None = 600.0
    max_body_bytes: int = 1 << 20


def resolve_route(spec: Speculative | None, task: str, routes: SpecConfig) -> Route:
    """The request's speculative override on top of the server's route for its task: the request's
    drafter text is parsed here, once (a malformed one is a UserError)."""
    route = routes.route(task)
    if spec is None:
        return route
    if not spec.enabled:
        return Route(parse("none"), route.k, False)
    adaptive = route.adaptive if spec.adaptive is None else spec.adaptive
    return Route(parse(spec.drafter) if spec.drafter else route.drafter, spec.k or route.k, adaptive)


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n".encode()


CLIENT_LEFT = object()  # put in a request's event queue when its client disconnects


async def _disconnected(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to go away (ASGI http.disconnect; the body has been read), then say so in
    `queue`: the request's events and its client's departure arrive in one place."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait((None, CLIENT_LEFT))


def unparsable(cause: BaseException) -> str:
    """Why the JSON parser rejected a body, naming the cause (FastAPI says only that it failed)."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"the body is not valid {cause.encoding.upper()} (byte 0x{byte} at offset {cause.start})"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"the body has an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"the body could not be parsed as JSON: {type(cause).__name__}: {cause}"


# -- the app ----------------------------------------------------------------------------------------


def create_app(engine: eng.Engine, opts: AppOptions, *, start_engine: bool = True) -> FastAPI:
    tokenizer, context, vocab = engine.tokenizer, engine.model.max_length, engine.model.vocab_size

    @asynccontextmanager
    async def lifespan(app):
        if start_engine:
            engine.start()
        yield
        engine.stop()  # in-flight requests have finished (uvicorn waits for them) or are failed now
        engine.pool.caches.save()  # --suffix-cache: atomically

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        # a union (content: str | list of parts) reports each member; our own checks say the most
        first = next(
            (e for e in errors if not e.get("type", "").endswith("_type")),
            errors[0] if errors else {"loc": (), "msg": "invalid request"},
        )
        if first.get("type") == "json_invalid":  # loc is (body, character offset): not a parameter
            where = first.get("loc", ("", "?"))[-1]
            return error_response(
                400,
                f"the body is not valid JSON (at character {where}): "
                f"{first.get('ctx', {}).get('error', first.get('msg'))}",
                "invalid_request_error",
            )
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        return error_response(
            400, f"{param + ': ' if param else ''}{first.get('msg')}", "invalid_request_error", param
        )

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}
        message = str(exc.detail)
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI: "error parsing the body"
            message = unparsable(exc.__cause__)
        return error_response(exc.status_code, message, kind.get(exc.status_code, "invalid_request_error"))

    @app.exception_handler(ApiError)
    async def _api(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        log.exception("request %s failed", request_id(request.scope), exc_info=exc)
        return error_response(500, "internal server error", "internal_error", headers={"Connection": "close"})

    def build(req, ids: list[int], task_text: str, rid: str) -> eng.Request:
        if req.model is not None and req.model != opts.model_name:
            raise ApiError(
                404,
                f"model {req.model!r} not found; this server serves {opts.model_name!r}",
                "not_found_error",
                "model",
                "model_not_found",
            )
        if not ids:
            raise ApiError(400, "prompt is empty after tokenization", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"token ids must be in [0, {vocab})", param="prompt")
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
        room = context - len(ids)
        if max_tokens is None:
            max_tokens = 16 if isinstance(req, CompletionRequest) else room
        if max_tokens < 1 or len(ids) + max_tokens > context:
            raise ApiError(
                400,
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        task = req.task or classify(task_text)
        try:
            route = resolve_route(req.speculative, task, opts.routes)
            engine.pool.template(route.drafter)  # unknown or not loaded -> 400
            params = Warp(req.temperature, max(req.top_k, 0), req.top_p)
        except UserError as e:
            raise ApiError(400, str(e), param="speculative.drafter") from None
        if isinstance(req, ChatRequest) and req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        grammar = compile_format(req.response_format)
        if grammar is not None and req.ignore_eos:
            raise ApiError(
                400,
                "ignore_eos cannot be used with a response_format: the output ends where it completes",
                param="ignore_eos",
            )
        penalties = Penalties(req.presence_penalty, req.frequency_penalty, req.repetition_penalty)
        return eng.Request(
            ids,
            params,
            max_tokens,
            tuple(req.stop or ()),
            req.seed,
            route.drafter,
            route.k,
            route.adaptive,
            task,
            req.ignore_eos,
            opts.timeout_s,
            penalties=penalties if penalties.active else None,
            grammar=grammar,
            logprobs=req.top_logprobs_asked(),
            request_id=rid,
        )

    def compile_format(fmt: ResponseFormat | None) -> str | None:
        """The request's response_format as a compiled grammar (None: free text); a bad one is a 400."""
        if fmt is None or fmt.type == "text":
            return None
        try:  # the API's one reading of a response_format (api/structured.py)
            structured = StructuredOutputs.from_response_format(
                fmt.model_dump(by_alias=True, exclude_none=True)
            )
            return structured.compile(engine.grammars())
        except UserError as e:
            raise ApiError(400, str(e), param="response_format") from None

    async def run(request: Request, req, ids: list[int], task_text: str, fmt: CompletionFormat):
        """Submit the request's n samples (sample i seeded seed + i; siblings wait for the first's
        prompt KV in the prefix cache) and answer with their events, streamed or collected."""
        template = build(req, ids, task_text, request_id(request.scope))
        template.scope = engine.pool.caches.scope_key(request.headers.get("authorization"), req.user)
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink_of(index: int):
            def sink(event):
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, (index, event))
                except RuntimeError:  # the event loop is gone (shutdown)
                    pass

            return sink

        seqs = []
        try:
            for i in range(req.n):
                seed = None if template.seed is None else (template.seed + i) % 2**63
                engine_req = dataclasses.replace(template, seed=seed, after=seqs[0] if seqs else None)
                seqs.append(engine.submit(engine_req, sink_of(i)))
        except eng.QueueFull as e:
            for seq in seqs:
                engine.cancel(seq)
            engine.metrics.rejected.labels(engine.metrics.model_name, "queue_full").inc()
            raise ApiError(
                429, str(e), "rate_limit_exceeded", code="queue_full", headers={"Retry-After": "1"}
            ) from None
        except eng.ShuttingDown as e:
            for seq in seqs:
                engine.cancel(seq)
            raise ApiError(503, str(e), "service_unavailable") from None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _stream(seqs, queue, fmt, include_usage, template.logprobs is not None),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _collect(request, seqs, queue, fmt, template.logprobs is not None)

    async def _stream(seqs, queue, fmt: CompletionFormat, include_usage: bool, logprobs: bool):
        usages: dict[int, dict] = {}
        try:
            for obj in fmt.opening():
                yield _sse(obj)
            while len(usages) < len(seqs):
                index, event = await queue.get()
                if isinstance(event, eng.Delta):
                    yield _sse(
                        fmt.chunk(
                            index, event.text, fmt.logprobs(index, event.logprobs if logprobs else None)
                        )
                    )
                    continue
                if isinstance(event, eng.Done):
                    usages[index] = event.usage.to_json()
                    lp = fmt.logprobs(index, event.logprobs) if logprobs and event.logprobs else None
                    yield _sse(fmt.chunk(index, "", lp, event.finish_reason))
                    continue
                usages = {i: {} for i in range(len(seqs))}  # one sample failed: the response ends
                yield _sse(
                    {"error": {"message": event.message, "type": event.type, "param": None, "code": None}}
                )
                yield _sse("[DONE]")
                return
            if include_usage:
                yield _sse(fmt.usage_chunk(merge_usage([usages[i] for i in range(len(seqs))])))
            yield _sse("[DONE]")
        finally:
            for seq in seqs:  # the client went away, a sample failed, or all finished (a no-op then)
                engine.cancel(seq)

    async def _collect(request: Request, seqs, queue, fmt: CompletionFormat, logprobs: bool):
        """A non-streamed request's events -> its response; a client that leaves cancels its samples at
        once (the engine frees their slots before its next step), not only when no token arrives."""
        left = asyncio.create_task(_disconnected(request, queue))
        parts = [[] for _ in seqs]
        entries = [[] for _ in seqs]
        done: dict[int, eng.Done] = {}
        try:
            while len(done) < len(seqs):
                index, event = await queue.get()
                if event is CLIENT_LEFT:
                    for seq in seqs:
                        engine.cancel(seq)
                    return Response(status_code=499)
                if isinstance(event, eng.Delta):
                    parts[index].append(event.text)
                    entries[index] += event.logprobs
                elif isinstance(event, eng.Done):
                    done[index] = event
                    entries[index] += event.logprobs
                else:
                    for seq in seqs:
                        engine.cancel(seq)
                    headers = {"Connection": "close"} if event.status >= 500 else None
                    return error_response(event.status, event.message, event.type, headers=headers)
        except asyncio.CancelledError:
            for seq in seqs:
                engine.cancel(seq)
            raise
        finally:
            left.cancel()
        choices = [
            (
                "".join(parts[i]),
                done[i].finish_reason,
                fmt.logprobs(i, entries[i][: len(seqs[i].out)]) if logprobs else None,
            )
            for i in range(len(seqs))
        ]
        return JSONResponse(
            fmt.full(choices, merge_usage([done[i].usage.to_json() for i in range(len(seqs))]))
        )

    def token_text(token: int) -> str:
        return tokenizer.decode([token])

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

    return Guard(app, opts.api_key, opts.max_body_bytes)
