"""Running the real server (uvicorn on a free loopback port, in a thread) for the server tests."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from specdecode.core.sampling import Warp
from specdecode.decoding.generation import generate
from specdecode.drafters import parse
from specdecode.drafters.none import NoDrafter
from specdecode.engine import build_engine, default_routes
from specdecode.engine.loop import Engine
from specdecode.server.app import AppOptions, create_app
from specdecode.server.lifecycle import Server

MODEL = "tiny"
# Request fields the fuzz tests set to odd values (test_server_fuzz.py, test_server_hardening.py), each
# adding its own: the completion and chat fields the server knows, so that mutations reach its checks.
REQUEST_FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "n",
    "stream",
    "speculative",
    "task",
    "ignore_eos",
    "logprobs",
    "stream_options",
]


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    engine: Engine
    server: Server


@contextmanager
def serve(
    target,
    *,
    drafter="ngram",
    k=4,
    adaptive=False,
    routes=None,
    max_batch=8,
    queue=64,
    load_control=True,
    start_engine=True,
    drain_s=5.0,
    suffix_caches=None,
    trace_steps=0,
    **opts,
):
    routes = routes or default_routes(parse(drafter), k, adaptive)
    engine = build_engine(
        target,
        routes,
        model_name=MODEL,
        max_batch=max_batch,
        queue_size=queue,
        load_control=load_control,
        suffix_caches=suffix_caches,
        trace_steps=trace_steps,
    )
    app = create_app(engine, AppOptions(MODEL, **opts), start_engine=start_engine)
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"), engine, drain_s=drain_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Running(f"http://127.0.0.1:{port}", engine, server)
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "server did not shut down"


def reference(target, ids: list[int], max_tokens: int, stop=(), drafter=None):
    """The same request run alone through the single-sequence decoder (greedy)."""
    return generate(
        target,
        drafter or NoDrafter(),
        list(ids),
        k=4,
        params=Warp(),
        max_new_tokens=max_tokens,
        stop=stop,
    )


@contextmanager
def scheduler_held(engine: Engine):
    """Park the scheduler at the top of its next iteration (Engine.paused), so that a request is
    deterministically mid-flight: the tiny model would otherwise finish 480 tokens in tens of
    milliseconds, faster than a test can act. The lock stays free: the HTTP side keeps serving and
    submits, cancels and shutdown go through while it is held."""
    with engine.paused():
        yield


def until(condition, timeout: float = 30.0) -> None:
    """Wait for a state instead of sleeping a guess: slow or busy machines only take longer."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the server's state"
        time.sleep(0.01)
