"""The engine's step trace (`serve --trace-steps N`, GET /stats/steps) on the real server: each step is
recorded with its rows and times, the rows add up to what the requests report, and the ring is bounded."""

import time

import httpx
import pytest

from serving import serve
from specdecode.engine.trace import StepRecord, StepTrace

SIZE = 48


@pytest.fixture(scope="module")
def server(target):
    with serve(target, drafter="ngram", k=4, max_batch=4, trace_steps=SIZE) as running:
        yield running


def _complete(server, prompt: list[int], max_tokens: int, spec: dict) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json={**body, "speculative": spec}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def _trace(server) -> dict:
    r = httpx.get(server.url + "/stats/steps", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_each_step_is_recorded_with_rows_that_add_up_to_the_requests_usage(server, target):
    before = _trace(server)["total"]
    began = time.time()
    prompt = [(i * 7) % 200 + 3 for i in range(300)]  # fresh: no prefix-cache hit, several chunks
    usage = _complete(server, prompt, 12, {"drafter": "ngram", "k": 4})
    trace = _trace(server)
    new = trace["total"] - before
    steps = trace["steps"][-new:]
    assert 0 < new <= SIZE and len(steps) == new
    # the request's verify forwards are the steps it decoded in; its prompt went in by chunks
    assert sum(s["decode_rows"] for s in steps) == usage["speculative"]["num_verify_forwards"]
    assert sum(s["prompt_tokens"] for s in steps) == len(prompt) - 1
    assert sum(s["prompt_rows"] for s in steps) == sum(1 for s in steps if s["prompt_tokens"])
    assert all(s["decode_rows"] + s["prompt_rows"] >= 1 for s in steps)  # every step ran a forward
    starts = [s["t"] for s in steps]
    assert began - 1 <= starts[0] and starts == sorted(starts) and starts[-1] <= time.time()
    for s in steps:
        assert 0 < s["forward_s"] <= s["step_s"]
        assert s["python_s"] == pytest.approx(s["step_s"] - s["forward_s"])
    for a, b in zip(steps, steps[1:]):  # a step ends before the next one begins
        assert a["t"] + a["step_s"] <= b["t"] + 1e-3


def test_the_trace_keeps_only_the_last_steps(server, target):
    before = _trace(server)["total"]
    _complete(server, [5, 6, 7, 8], SIZE + 20, {"enabled": False})  # one step a token: more than the ring
    trace = _trace(server)
    assert trace["size"] == SIZE and trace["total"] >= before + SIZE + 20
    assert len(trace["steps"]) == SIZE
    assert all(s["decode_rows"] == 1 and s["prompt_rows"] == 0 for s in trace["steps"][-SIZE:])


def test_no_trace_unless_asked(target):
    with serve(target, max_batch=2) as running:
        r = httpx.get(running.url + "/stats/steps", timeout=10)
    assert r.status_code == 404 and "--trace-steps" in r.json()["error"]["message"]


def test_the_ring_drops_the_oldest_and_refuses_size_zero():
    with pytest.raises(ValueError, match="at least 1"):
        StepTrace(0)
    ring = StepTrace(2)
    for i in range(3):
        ring.add(StepRecord(float(i), 0.02, 0.015, 4, 0, 0))
    assert [r.t for r in ring.records()] == [1.0, 2.0] and ring.total == 3
