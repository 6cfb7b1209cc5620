"""Invalid input, auth, limits, cancellation, timeouts, fuzzing and graceful shutdown of the real server."""

import json
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serving import MODEL, REQUEST_FIELDS, scheduler_held, serve
from specdecode.cli import main

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def guarded(target):
    with serve(target, api_key=KEY, max_body_bytes=4096, load_control=False, max_batch=2) as running:
        yield running


def _post(server, path, body, headers=AUTH, **kw):
    return httpx.post(server.url + path, json=body, headers=headers, timeout=30, **kw)


def _assert_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def _metric(server, name, **labels):
    text = httpx.get(server.url + "/metrics").text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


BAD_COMPLETIONS = [
    ({"model": MODEL}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 99999]}, "prompt"),
    ({"prompt": "hi", "temperature": -0.1}, "temperature"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_k": -2}, "top_k"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 100000}, "max_tokens"),  # prompt + max_tokens > context (512)
    ({"prompt": "hi " * 300, "max_tokens": 300}, "max_tokens"),
    ({"prompt": "hi", "n": 17}, "n"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "stop": ["x"] * 17}, "stop"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "response_format": {"type": "xml"}}, "response_format.type"),
    ({"prompt": "hi", "response_format": {"type": "regex"}}, "response_format"),
    ({"prompt": "hi", "response_format": {"type": "regex", "pattern": "(a"}}, "response_format"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ({"prompt": "hi", "best_of": 2}, "best_of"),  # unknown fields are rejected
    ({"prompt": "hi", "speculative": {"k": 0}}, "speculative.k"),
    ({"prompt": "hi", "speculative": {"k": 4, "colour": "red"}}, "speculative.colour"),
    ({"prompt": "hi", "speculative": {"drafter": "medusa"}}, "speculative.drafter"),
    ({"prompt": "hi", "speculative": {"drafter": "draft:/not/loaded"}}, "speculative.drafter"),
    ({"prompt": "hi", "speculative": {"drafter": "ngram:5-2"}}, "speculative.drafter"),
    ({"prompt": "hi", "task": "poetry"}, "task"),
    ({"prompt": "hi", "stream": "maybe"}, "stream"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
def test_invalid_completion_requests_get_400_with_openai_error_shape(guarded, body, param):
    err = _assert_error(_post(guarded, "/v1/completions", body), 400, param)
    assert err["type"] == "invalid_request_error"


def test_invalid_chat_requests_and_bodies(guarded):
    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]}, None),
        ({"messages": "hi"}, "messages"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ]:
        _assert_error(_post(guarded, "/v1/chat/completions", body), 400, param)
    for raw in (b"{not json", b"[1, 2]", b"null", b"\xff\xfe"):
        resp = httpx.post(
            guarded.url + "/v1/completions", content=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        _assert_error(resp, 400)
    err = _assert_error(_post(guarded, "/v1/completions", {"model": "gpt-9", "prompt": "hi"}), 404, "model")
    assert err["code"] == "model_not_found"
    _assert_error(httpx.get(guarded.url + "/v1/nothing-here", headers=AUTH), 404)


def test_api_key_is_required_on_api_routes_only(guarded):
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
    ):
        err = _assert_error(_post(guarded, "/v1/completions", body, headers=headers), 401)
        assert err["type"] == "authentication_error"
    _assert_error(httpx.get(guarded.url + "/v1/models"), 401)
    _assert_error(httpx.get(guarded.url + "/stats"), 401)
    # auth is checked before the body is parsed: a malformed body without a key is still a 401
    _assert_error(httpx.post(guarded.url + "/v1/completions", content=b"{oops"), 401)
    assert _post(guarded, "/v1/completions", body).status_code == 200
    assert httpx.get(guarded.url + "/health").status_code == 200  # probes and scrapers need no key
    assert httpx.get(guarded.url + "/metrics").status_code == 200


def test_oversized_bodies_get_413(guarded):
    big = {"model": MODEL, "prompt": "x" * 5000}
    err = _assert_error(_post(guarded, "/v1/completions", big), 413)
    assert "4096" in err["message"]

    def chunks():  # no Content-Length: the limit is enforced while the body streams in
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    resp = httpx.post(
        guarded.url + "/v1/completions",
        content=chunks(),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    _assert_error(resp, 413)
    assert httpx.get(guarded.url + "/health").status_code == 200


def test_full_queue_gets_429_and_a_vanished_client_is_cancelled(target):
    """The scheduler is held back, so the queue state is exact: max_batch + queue = 2 requests wait, the
    next is refused. The waiting clients then give up; once the scheduler runs, it drops them (abort)."""
    with serve(target, queue=1, max_batch=1, start_engine=False, load_control=False) as srv:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
        outcome = []

        def give_up_after_half_a_second():
            try:
                outcome.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=0.5).status_code)
            except httpx.ReadTimeout:
                outcome.append("gave up")

        clients = [threading.Thread(target=give_up_after_half_a_second) for _ in range(2)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 10
        while _metric(srv, "specdecode:num_requests_waiting") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        err = _assert_error(httpx.post(srv.url + "/v1/completions", json=body), 429)
        assert err["code"] == "queue_full"
        for client in clients:
            client.join()
        assert outcome == ["gave up"] * 2
        time.sleep(0.6)  # the server notices the disconnect within its 0.25 s poll
        srv.engine.start()
        while _metric(srv, "specdecode:request_success_total", finished_reason="abort") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert _metric(srv, "specdecode:num_requests_waiting") == 0
        assert _metric(srv, "specdecode:generation_tokens_total") == 0
        assert httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 200


LONG = {
    "model": MODEL,
    "prompt": "Hello",
    "max_tokens": 480,
    "temperature": 0,
    "ignore_eos": True,
    "speculative": {"enabled": False},
}


def test_disconnect_mid_stream_frees_the_slot(target):
    with serve(target, max_batch=1, load_control=False) as srv:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}) as resp:
            lines = resp.iter_lines()  # keep a reference: a collected iter_lines() closes the response
            first = next(line for line in lines if line)
            with scheduler_held(srv.engine):
                assert first.startswith("data: ")
                assert _metric(srv, "specdecode:num_requests_running") == 1
                resp.close()  # the client goes away mid-stream
                time.sleep(0.3)
        deadline = time.monotonic() + 10
        while _metric(srv, "specdecode:num_requests_running") > 0:
            assert time.monotonic() < deadline, "the slot was not freed"
            time.sleep(0.02)
        assert _metric(srv, "specdecode:request_success_total", finished_reason="abort") == 1
        assert _metric(srv, "specdecode:generation_tokens_total") < 480
        assert srv.engine.free == [0]  # the only KV slot is free again ...
        r = httpx.post(
            srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 5}, timeout=30
        )
        assert (
            r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        )  # ... and serves the next one


def test_request_timeout_while_waiting_and_while_running(target):
    with serve(target, timeout_s=0.5, load_control=False) as srv:
        with scheduler_held(srv.engine):  # queued, never scheduled before its deadline
            pending = threading.Thread(
                target=lambda: results.append(httpx.post(srv.url + "/v1/completions", json=LONG, timeout=30))
            )
            results = []
            pending.start()
            time.sleep(0.8)
        pending.join()
        err = _assert_error(results[0], 408)
        assert err["type"] == "timeout"
        with httpx.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line).startswith("data: ")
            with scheduler_held(srv.engine):  # running, stalled past its deadline
                time.sleep(0.8)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["error"]["type"] == "timeout"
        assert _metric(srv, "specdecode:request_success_total", finished_reason="timeout") == 2
        assert _metric(srv, "specdecode:num_requests_running") == 0
        assert _metric(srv, "specdecode:generation_tokens_total") < 480


def test_graceful_shutdown_finishes_in_flight_streams(target):
    """What uvicorn does on SIGTERM (should_exit): stop listening, let running streams finish, then the
    lifespan shutdown stops the engine."""
    with serve(target, max_batch=2, load_control=False) as srv:
        with httpx.stream(
            "POST",
            srv.url + "/v1/completions",
            json={**LONG, "stream": True, "stream_options": {"include_usage": True}},
        ) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line).startswith("data: ")
            with scheduler_held(srv.engine):
                srv.server.should_exit = True
                time.sleep(0.5)
                with pytest.raises(httpx.TransportError):  # no new connections
                    httpx.get(srv.url + "/health", timeout=2)
                assert srv.engine.running  # the stream is still in flight
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["usage"]["completion_tokens"] == 480  # finished, not cut off


_FIELDS = [
    *REQUEST_FIELDS,
    "role",
    "content",
]
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from([MODEL, "user", "ngram", "none", "code"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
_bodies = st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6) | _json


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies, chat=st.booleans())
def test_fuzzed_requests_never_get_500(guarded, body, chat):
    if isinstance(body, dict) and (isinstance(body.get("max_tokens"), int) or "max_tokens" not in body):
        body["max_tokens"] = min(body.get("max_tokens", 8), 8)  # keep accidental valid requests short
    resp = _post(guarded, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert resp.status_code in (200, 400, 404, 413), resp.text
    if resp.status_code != 200:
        _assert_error(resp, resp.status_code)


def test_fuzzing_left_the_server_healthy(guarded):
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert _metric(guarded, "specdecode:request_success_total", finished_reason="error") == 0


def test_serve_rejects_bad_flags_before_loading(capsys):
    assert main(["serve", "--k", "0"]) == 2
    assert main(["serve", "--max-batch", "0"]) == 2
    assert main(["serve", "--drafter", "telepathy"]) == 2
    assert "unknown drafter" in capsys.readouterr().err
    assert main(["serve", "--timeout", "0"]) == 2  # no limit is the default; a limit must be positive
    assert "--timeout must be positive, got 0.0" in capsys.readouterr().err
    # medusa, eagle, trees and ensembles are served since the batched core verifies trees and returns
    # features per row (test_medusa_eagle.py::test_server_serves_feature_drafters_with_single_request_output)


def test_serve_command_wires_a_working_app(tiny_model_dir, monkeypatch):
    """`specdecode serve` end to end except the socket: uvicorn.run gets the app, which then serves."""
    from fastapi.testclient import TestClient

    from specdecode.server.lifecycle import FLUSH_S, Server

    seen = {}
    monkeypatch.setattr(Server, "run", lambda self: seen.update(app=self.config.app, server=self))
    assert (
        main(
            [
                "serve",
                "--target",
                tiny_model_dir,
                "--port",
                "8123",
                "--served-model-name",
                MODEL,
                "--threads",
                "1",
                "--max-batch",
                "2",
                "--api-key",
                KEY,
                "--shutdown-timeout",
                "7",
            ]
        )
        == 0
    )
    config = seen["server"].config
    assert (config.host, config.port, seen["server"].drain_s) == ("127.0.0.1", 8123, 7.0)
    assert config.timeout_graceful_shutdown == 7.0 + FLUSH_S
    with TestClient(seen["app"]) as client:  # runs the lifespan: engine thread up, then down
        r = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            headers=AUTH,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL
