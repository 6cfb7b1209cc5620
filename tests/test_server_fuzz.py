"""2,000+ generated malformed requests against the real server (tiny model): never a 500, and the
server still answers correctly afterwards (issue 19). Bodies are mutations of valid requests:
wrong types, out-of-range numbers, bad Unicode, broken JSON, unknown fields, odd content parts."""

import json
import random

import httpx
import pytest

from serving import MODEL, REQUEST_FIELDS, reference, serve

N = 2000

VALID = [
    {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "temperature": 0},
    {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0.5, "seed": 3},
]
ODD_VALUES = [
    None,
    True,
    -1,
    0,
    1e308,
    -1e-320,
    2**70,
    "",
    "8",
    "\ud800",
    "x" * 3000,
    [],
    {},
    [None],
    [-3],
    [{"type": "image_url"}],
    {"drafter": "ngram:9-1"},
    {"drafter": "telepathy"},
    {"k": 99},
    1e-40,
    float("nan"),
    [{"role": "user"}],
    [{"role": "alien", "content": "x"}],
    "ngram: 2-4",
]
FIELDS = [
    *REQUEST_FIELDS,
    "user",
    "echo",
    "bogus",
]


def mutate(rng: random.Random) -> tuple[str, bytes]:
    body = dict(rng.choice(VALID))
    chat = "messages" in body
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.6:
            body[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
        elif roll < 0.8 and body:
            body.pop(rng.choice(list(body)))
        else:
            chat = not chat
    text = json.dumps(body, allow_nan=True)
    if rng.random() < 0.1:  # broken JSON: cut, or a stray byte
        text = text[: rng.randint(0, len(text))] if rng.random() < 0.5 else text.replace(",", ",\x00", 1)
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:
        raw += b"\xff\xfe"  # not UTF-8
    return ("/v1/chat/completions" if chat else "/v1/completions"), raw


@pytest.fixture(scope="module")
def server(target):
    with serve(target, max_batch=4, load_control=False, max_body_bytes=64 * 1024) as running:
        yield running


def test_thousands_of_malformed_requests_never_get_500_and_the_server_stays_correct(target, server):
    rng = random.Random(19)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for _ in range(N):
            path, raw = mutate(rng)
            r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (path, raw[:300], r.text)
            if r.status_code >= 400:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert sum(statuses.values()) == N and statuses.get(400, 0) > N // 2
        good = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Hello there", "max_tokens": 8, "temperature": 0},
        )
    ids = target.tokenizer("Hello there")["input_ids"]
    assert good.json()["choices"][0]["text"] == reference(target, ids, 8).text
