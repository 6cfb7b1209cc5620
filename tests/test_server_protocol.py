"""HTTP details of the real server: X-Request-Id on every response and in the log, HEAD /health, and
400s that name the cause for a wrong Content-Type and for bodies the JSON parser rejects."""

import json
import logging
import re
import sys

import httpx
import pytest

from serving import MODEL, serve

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(target):
    with serve(target, api_key=KEY, max_body_bytes=64 << 10, load_control=False, max_batch=2) as running:
        yield running


def _error(resp, status: int) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] is None
    return err["message"]


def test_every_response_echoes_the_clients_request_id_or_carries_a_fresh_one(server):
    url, body = server.url, {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    responses = [
        httpx.post(url + "/v1/completions", json=body, headers=AUTH),  # 200
        httpx.post(url + "/v1/completions", json={**body, "top_p": 0}, headers=AUTH),  # 400
        httpx.post(url + "/v1/completions", json=body),  # 401
        httpx.post(url + "/v1/completions", json={**body, "model": "x"}, headers=AUTH),  # 404
        httpx.post(url + "/v1/completions", content=b"x" * (65 << 10), headers={**AUTH, **JSON}),  # 413
        httpx.get(url + "/health"),
        httpx.get(url + "/metrics"),
    ]
    assert [r.status_code for r in responses] == [200, 400, 401, 404, 413, 200, 200]
    fresh = [r.headers["x-request-id"] for r in responses]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in fresh) and len(set(fresh)) == len(fresh)
    for r in responses:
        again = httpx.request(
            r.request.method,
            str(r.request.url),
            content=r.request.content,
            headers={**r.request.headers, "X-Request-Id": "trace-7/a:b"},
        )
        assert again.status_code == r.status_code and again.headers["x-request-id"] == "trace-7/a:b"
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        json={**body, "stream": True},
        headers={**AUTH, "X-Request-Id": "s-1"},
    ) as resp:
        assert resp.headers["x-request-id"] == "s-1"
        assert [line for line in resp.iter_lines() if line][-1] == "data: [DONE]"


def test_an_unusable_request_id_is_refused_by_name(server):
    for bad in ("", "a b", "x" * 129, "line\tbreak"):
        r = httpx.get(server.url + "/health", headers={"X-Request-Id": bad})
        if bad == "":  # an empty header is no id: one is generated
            assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32
            continue
        assert "X-Request-Id" in _error(r, 400)
        assert r.headers["x-request-id"] != bad  # never echoed into a header


def test_the_request_id_names_the_request_in_the_log(server, caplog):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    with caplog.at_level(logging.INFO, logger="specdecode.engine"):
        r = httpx.post(
            server.url + "/v1/completions", json=body, headers={**AUTH, "X-Request-Id": "log-me-1"}
        )
    assert r.status_code == 200
    assert any("log-me-1" in rec.getMessage() and "finished" in rec.getMessage() for rec in caplog.records)


def test_head_health_answers_like_get_without_a_body(server):
    r = httpx.head(server.url + "/health")
    assert r.status_code == 200 and r.content == b"" and r.headers["x-request-id"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers,named",
    [
        ({"Content-Type": "text/plain"}, "'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, "'application/x-www-form-urlencoded'"),
        ({}, "no Content-Type header"),
    ],
)
def test_a_body_that_is_not_declared_json_is_a_400_naming_the_content_type(server, headers, named):
    raw = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2}).encode()
    for path in ("/v1/completions", "/v1/chat/completions"):
        message = _error(httpx.post(server.url + path, content=raw, headers={**AUTH, **headers}), 400)
        assert "application/json" in message and named in message
    ok = httpx.post(
        server.url + "/v1/completions",
        content=raw,
        headers={**AUTH, "Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "raw,named",
    [
        (b'{"model": "tiny", "prompt": "\xff\xfe oops"}', "not valid UTF-8 (byte 0xff at offset 29)"),
        (
            b'{"model": "tiny", "prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}",
            f"integer of more than {sys.get_int_max_str_digits()} digits",
        ),
        (b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", "nested too deeply"),
    ],
    ids=["invalid-utf8", "huge-integer", "deep-nesting"],
)
def test_a_body_the_json_parser_rejects_is_a_400_naming_the_cause(server, raw, named):
    message = _error(httpx.post(server.url + "/v1/completions", content=raw, headers={**AUTH, **JSON}), 400)
    assert named in message
    assert httpx.get(server.url + "/health").status_code == 200
