"""Shutdown as docs/server.md promises it: on SIGTERM / Ctrl-C (or `should_exit`) the server stops
accepting connections and lets running requests finish for `drain_s` seconds; then the engine fails
whatever still runs, so a stream ends with an error event and `[DONE]` and a waiting non-streamed
request gets 503, instead of uvicorn cutting the connection mid-body."""

from __future__ import annotations

import asyncio
import threading

import uvicorn

from specdecode.engine.loop import Engine

FLUSH_S = 5.0  # after the engine fails the running requests: time for their last events to be sent


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: Engine, drain_s: float):
        config.timeout_graceful_shutdown = drain_s + FLUSH_S
        super().__init__(config)
        self.engine, self.drain_s = engine, drain_s

    async def shutdown(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(
            self.drain_s, lambda: threading.Thread(target=self.engine.stop, daemon=True).start()
        )
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
