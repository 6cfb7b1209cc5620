"""A request's samples submitted to the engine and answered from their events: streamed as
server-sent events, or collected into one response. The engine thread's events and the client's
departure arrive in one asyncio queue; whatever ends the answer (the client gone, a failed sample,
shutdown) cancels the samples still running."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdecode import engine as eng
from specdecode.server.responses import CompletionFormat, merge_usage
from specdecode.server.schemas import ApiError, error_response

CLIENT_LEFT = object()  # put in a request's event queue when its client disconnects


async def answer(
    engine: eng.Engine, request: Request, template: eng.Request, req, fmt: CompletionFormat
) -> Response:
    """Submit req's n samples of `template` (sample i seeded seed + i; siblings wait for the first's
    prompt KV in the prefix cache) and answer with their events, streamed or collected."""
    queue: asyncio.Queue = asyncio.Queue()
    seqs = _submit(engine, template, req.n, queue)
    logprobs = template.logprobs is not None
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _stream(engine, seqs, queue, fmt, include_usage, logprobs),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return await _collect(engine, request, seqs, queue, fmt, logprobs)


def _submit(engine: eng.Engine, template: eng.Request, n: int, queue: asyncio.Queue) -> list:
    """The n samples queued in the engine, each delivering (its index, event) to `queue` from the
    engine thread; a full queue is a 429 and shutdown a 503, with none of the samples left queued."""
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
        for i in range(n):
            seed = None if template.seed is None else (template.seed + i) % 2**63
            engine_req = dataclasses.replace(template, seed=seed, after=seqs[0] if seqs else None)
            seqs.append(engine.submit(engine_req, sink_of(i)))
    except eng.QueueFull as e:
        _cancel(engine, seqs)
        engine.metrics.rejected.labels(engine.metrics.model_name, "queue_full").inc()
        raise ApiError(
            429, str(e), "rate_limit_exceeded", code="queue_full", headers={"Retry-After": "1"}
        ) from None
    except eng.ShuttingDown as e:
        _cancel(engine, seqs)
        raise ApiError(503, str(e), "service_unavailable") from None
    except eng.TooLarge as e:
        _cancel(engine, seqs)
        engine.metrics.rejected.labels(engine.metrics.model_name, "kv_memory").inc()
        raise ApiError(400, str(e), param="max_tokens", code="kv_memory_exceeded") from None
    return seqs


def _cancel(engine: eng.Engine, seqs: list) -> None:
    for seq in seqs:
        engine.cancel(seq)


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _stream(
    engine: eng.Engine, seqs, queue, fmt: CompletionFormat, include_usage: bool, logprobs: bool
):
    usages: dict[int, dict] = {}
    try:
        for obj in fmt.opening():
            yield _sse(obj)
        while len(usages) < len(seqs):
            index, event = await queue.get()
            if isinstance(event, eng.Delta):
                yield _sse(
                    fmt.chunk(index, event.text, fmt.logprobs(index, event.logprobs if logprobs else None))
                )
                continue
            if isinstance(event, eng.Done):
                usages[index] = event.usage.to_json()
                lp = fmt.logprobs(index, event.logprobs) if logprobs and event.logprobs else None
                yield _sse(fmt.chunk(index, "", lp, event.finish_reason))
                continue
            usages = {i: {} for i in range(len(seqs))}  # one sample failed: the response ends
            yield _sse({"error": {"message": event.message, "type": event.type, "param": None, "code": None}})
            yield _sse("[DONE]")
            return
        if include_usage:
            yield _sse(fmt.usage_chunk(merge_usage([usages[i] for i in range(len(seqs))])))
        yield _sse("[DONE]")
    finally:
        _cancel(engine, seqs)  # the client went away, a sample failed, or all finished (a no-op then)


async def _disconnected(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to go away (ASGI http.disconnect; the body has been read), then say so in
    `queue`: the request's events and its client's departure arrive in one place."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait((None, CLIENT_LEFT))


async def _collect(engine: eng.Engine, request: Request, seqs, queue, fmt: CompletionFormat, logprobs: bool):
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
                _cancel(engine, seqs)
                return Response(status_code=499)
            if isinstance(event, eng.Delta):
                parts[index].append(event.text)
                entries[index] += event.logprobs
            elif isinstance(event, eng.Done):
                done[index] = event
                entries[index] += event.logprobs
            else:
                _cancel(engine, seqs)
                headers = {"Connection": "close"} if event.status >= 500 else None
                return error_response(event.status, event.message, event.type, headers=headers)
    except asyncio.CancelledError:
        _cancel(engine, seqs)
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
    return JSONResponse(fmt.full(choices, merge_usage([done[i].usage.to_json() for i in range(len(seqs))])))
