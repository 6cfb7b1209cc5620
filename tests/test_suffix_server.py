"""Suffix decoding in the server (issue 21): single-request greedy output, one cache per scope (one
tenant's responses never reach another's proposals), persistence and warming."""

import json

import httpx
import pytest

from serving import MODEL, reference, serve
from specdecode.drafters.suffix import read_responses
from specdecode.engine.suffix_cache import FORMAT, SuffixCaches
from specdecode.errors import UserError

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "One two three four five six seven eight nine ten. One two three",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
]
SPEC = "suffix:min_token_prob=0.05"


def complete(url, prompt, **extra):
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "speculative": {"drafter": SPEC, "k": 8},
        **extra,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_suffix_requests_equal_single_request_greedy_output_and_learn(target, tmp_path):
    caches = SuffixCaches("global", tmp_path / "cache.json")
    with serve(target, max_batch=4, suffix_caches=caches) as srv:
        drafted = 0
        for _ in range(2):  # the second round proposes from the first round's responses
            for prompt in PROMPTS:
                out = complete(srv.url, prompt)
                want = reference(target, target.tokenizer(prompt)["input_ids"], 24).text
                assert out["choices"][0]["text"] == want
                drafted += out["usage"]["speculative"]["num_draft_tokens"]
                assert out["usage"]["speculative"]["drafter"] == SPEC
        assert drafted > 0
        (cache,) = caches.caches.values()
        assert len(cache.responses()) == 6
    saved = json.loads((tmp_path / "cache.json").read_text())  # saved at shutdown
    assert saved["format"] == FORMAT and len(saved["caches"][0]["responses"]) == 6
    again = SuffixCaches("global", tmp_path / "cache.json")
    assert again.saved == {(saved["caches"][0]["spec"], ""): cache.responses()}


def test_one_tenants_responses_never_reach_another_tenants_cache(target):
    caches = SuffixCaches("user")
    with serve(target, max_batch=4, suffix_caches=caches) as srv:
        a = complete(srv.url, PROMPTS[0], user="alice")
        b = complete(srv.url, PROMPTS[1], user="bob")
    by_scope = {scope: cache.responses() for (_, scope), cache in caches.caches.items()}
    alice_ids = target.tokenizer(a["choices"][0]["text"], add_special_tokens=False)["input_ids"]
    assert set(by_scope) == {"user:alice", "user:bob"}
    assert len(by_scope["user:alice"]) == 1 and len(by_scope["user:bob"]) == 1
    assert by_scope["user:bob"] != by_scope["user:alice"] and alice_ids
    assert b["usage"]["completion_tokens"] == 24


def test_key_scope_hashes_the_api_key():
    caches = SuffixCaches("key")
    assert caches.scope_key("Bearer a", None) != caches.scope_key("Bearer b", None)
    assert "Bearer a" not in caches.scope_key("Bearer a", None)
    assert SuffixCaches("global").scope_key("Bearer a", "u") == ""
    with pytest.raises(UserError, match="--suffix-scope"):
        SuffixCaches("tenant")


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"format": "other", "caches": []}',
        json.dumps({"format": FORMAT, "caches": [{"spec": "suffix", "scope": "", "responses": [[1, -2]]}]}),
    ],
)
def test_a_corrupt_cache_file_is_a_clear_error_and_is_left_as_it_is(tmp_path, content):
    path = tmp_path / "cache.json"
    path.write_text(content)
    with pytest.raises(UserError, match="cannot be read"):
        SuffixCaches("global", path)
    assert path.read_text() == content


def test_warming_from_jsonl_and_a_train_data_directory(target, tmp_path):
    from specdecode import shards

    f = tmp_path / "past.jsonl"
    f.write_text(
        json.dumps({"response_ids": [5, 6, 7]}) + "\n" + json.dumps({"response": "hello there"}) + "\n"
    )
    warm = read_responses(str(f), target.tokenizer)
    assert (
        warm[0] == [5, 6, 7]
        and warm[1] == target.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    )
    d = tmp_path / "data"
    d.mkdir()
    shards.write(d / "shard-00000.sds", [shards.Record("a", "c", [1], [9, 9, 8])], {"name": "t"})
    assert read_responses(str(d), target.tokenizer) == [[9, 9, 8]]
    for content, message in [
        ("[5, 6]\n", ":1: expected an object, got list"),
        ("{\n", ":1: not valid JSON"),
        ('{"response_ids": [1]}\n{"text": "x"}\n', ":2: expected 'response_ids' or 'response'"),
    ]:
        f.write_text(content)
        with pytest.raises(UserError, match=message):
            read_responses(str(f), target.tokenizer)
    caches = SuffixCaches("global", warm=warm)
    from specdecode.drafters import SuffixDrafter

    template = SuffixDrafter()
    drafter = template.fork(lambda cache: caches.cache("suffix", "", cache))
    assert drafter.cache.responses() == warm and template.cache.responses() == []
