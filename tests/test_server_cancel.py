"""A client that leaves early, streamed or not, frees its KV slot before the engine's next step, and the
abort counter counts it exactly once (issue 38: a non-streamed request used to run to its end while
its tokens kept coming, because the disconnect was looked for only after 0.25 s without a token)."""

import threading
import time

import httpx
import pytest

from serving import MODEL, serve
from test_server_hardening import _metric

STEP_S = 0.05  # each engine step is slowed to this, so that a 480-token request runs for ~24 s


def _logged_steps(monkeypatch, engine) -> list[tuple[float, set[int]]]:
    """Slow every engine step down to STEP_S and log it: (monotonic start, ids of its sequences)."""
    steps, step = [], engine.core.step

    def logged(seqs, *args, **kwargs):
        steps.append((time.monotonic(), {id(seq) for seq in seqs}))
        time.sleep(STEP_S)
        return step(seqs, *args, **kwargs)

    monkeypatch.setattr(engine.core, "step", logged)
    return steps


def _running(engine, prompt: list[int]):
    """The engine's Sequence of the request with this prompt, once it holds a slot."""
    deadline = time.monotonic() + 10
    while True:
        found = [seq for seq in list(engine.running) if seq.request.prompt == prompt]
        if found:
            return found[0]
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)


def _body(prompt: list[int], **extra) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 480,
        "temperature": 0,
        "ignore_eos": True,
        "speculative": {"enabled": False},
        **extra,
    }


@pytest.mark.parametrize("streamed", [False, True], ids=["not-streamed", "streamed"])
def test_a_client_that_leaves_is_cancelled_before_the_next_step(target, monkeypatch, streamed):
    leaver, stayer = [1, 2, 3, 4], [5, 6, 7, 8]
    with serve(target, max_batch=2, load_control=False) as srv:
        steps = _logged_steps(monkeypatch, srv.engine)
        stays = []  # a neighbour that keeps the engine stepping throughout
        neighbour = threading.Thread(
            target=lambda: stays.append(
                httpx.post(srv.url + "/v1/completions", json=_body(stayer, max_tokens=120), timeout=60)
            )
        )
        neighbour.start()
        if streamed:
            with httpx.stream("POST", srv.url + "/v1/completions", json=_body(leaver, stream=True)) as resp:
                lines = resp.iter_lines()
                assert next(line for line in lines if line).startswith("data: ")
                seq = _running(srv.engine, leaver)
                resp.close()
                left = time.monotonic()
        else:
            gone = []

            def leave_after_a_while():
                try:
                    httpx.post(srv.url + "/v1/completions", json=_body(leaver), timeout=0.6)
                except httpx.ReadTimeout:  # the client gives up and closes its connection
                    gone.append(time.monotonic())

            client = threading.Thread(target=leave_after_a_while)
            client.start()
            seq = _running(srv.engine, leaver)
            client.join()
            (left,) = gone
        deadline = time.monotonic() + 10
        while seq in srv.engine.running:
            assert time.monotonic() < deadline, "the slot is still held"
            time.sleep(0.005)
        neighbour.join(60)
        held = [t for t, ids in steps if t > left and id(seq.dec) in ids]
        assert len(held) <= 1, f"the slot was held {len(held)} steps after its client left"
        assert seq.out and len(seq.out) < 480  # it ran, and was cut short
        assert stays[0].status_code == 200 and stays[0].json()["choices"][0]["finish_reason"] == "length"
        assert _metric(srv, "specdecode:request_success_total", finished_reason="abort") == 1
        assert _metric(srv, "specdecode:request_success_total", finished_reason="length") == 1
        assert sorted(srv.engine.free) == [0, 1]
