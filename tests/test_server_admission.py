"""Admission: `--max-batch B --queue Q` holds B + Q requests in flight before the first 429, whether or
not the scheduler thread has yet moved the waiting ones into free slots. The engine is driven directly
(no HTTP) and its thread is held at known points, so the counts do not depend on the machine's speed."""

import threading
import time

import pytest

from specdecode.core.sampling import Warp
from specdecode.drafters import parse
from specdecode.engine import build_engine, default_routes
from specdecode.engine.loop import Delta, Done, QueueFull, Request

MAX_BATCH, QUEUE = 2, 4


@pytest.fixture
def engine(target):
    engine = build_engine(
        target,
        default_routes(parse("ngram"), 4, False),
        model_name="tiny",
        max_batch=MAX_BATCH,
        queue_size=QUEUE,
        load_control=False,
    )
    yield engine
    engine.stop()


def request() -> Request:
    return Request([1, 2, 3, 4], Warp(), max_tokens=64, ignore_eos=True)


def test_a_burst_before_the_scheduler_runs_gets_max_batch_plus_queue_places(engine):
    """All B + Q requests arrive before the scheduler's first iteration (the engine is not started):
    none is refused although none is in a slot yet, and the next one is."""
    events = [[] for _ in range(MAX_BATCH + QUEUE)]
    for sink in events:
        engine.submit(request(), sink.append)
    assert len(engine.waiting) == MAX_BATCH + QUEUE and not engine.running
    with pytest.raises(QueueFull):
        engine.submit(request(), lambda event: None)


def test_the_same_places_hold_once_the_slots_are_taken_and_every_admitted_request_finishes(engine):
    """The first streamed text holds the engine thread inside its step: B requests run and Q wait, the
    next one is refused all the same; released, all B + Q finish."""
    gate, stepping = threading.Event(), threading.Event()
    done = []

    def sink(event):
        if isinstance(event, Delta) and not stepping.is_set():
            stepping.set()
            assert gate.wait(30)
        elif isinstance(event, Done):
            done.append(event)

    for _ in range(MAX_BATCH + QUEUE):
        engine.submit(request(), sink)
    engine.start()
    try:
        assert stepping.wait(30)
        assert (len(engine.running), len(engine.waiting)) == (MAX_BATCH, QUEUE)
        with pytest.raises(QueueFull):
            engine.submit(request(), lambda event: None)
    finally:
        gate.set()
    deadline = time.monotonic() + 30
    while len(done) < MAX_BATCH + QUEUE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [event.finish_reason for event in done] == ["length"] * (MAX_BATCH + QUEUE)
