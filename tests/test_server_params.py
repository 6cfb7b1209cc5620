"""The OpenAI parameters with speculation on, through the official openai client against the real server
on the tiny model: logprobs equal plain decoding's, n > 1, penalties, response_format; each one's
output with speculation equals its output without (greedy), for chain and tree drafters."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import torch

from serving import MODEL, reference, serve

SPECS = [{"enabled": False}, {"drafter": "ngram:1-3", "k": 4}, {"drafter": "ngram:1-3:b=3", "k": 4}]
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def server(target):
    with serve(target, drafter="ngram", k=4, max_batch=4) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _plain_logprobs(target, ids: list[int], out: list[int]) -> torch.Tensor:
    """[len(out), V] the target's log-probabilities at each generated position, one full forward."""
    model = target.model
    model.reset()
    logits = model.forward(torch.tensor(ids + out[:-1], dtype=torch.long)).logits[len(ids) - 1 :]
    model.reset()
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_equal_plain_decodings_for_every_drafter(target, client, stream):
    ids = target.tokenizer(PROMPT)["input_ids"]
    want = reference(target, ids, 16)
    plain = _plain_logprobs(target, ids, want.token_ids)
    for spec in SPECS:
        kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, logprobs=3)
        if stream:
            chunks = list(client.completions.create(**kwargs, stream=True, extra_body={"speculative": spec}))
            lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
            token_logprobs = [x for lp in lps for x in lp.token_logprobs]
            tops = [x for lp in lps for x in lp.top_logprobs]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
        else:
            r = client.completions.create(**kwargs, extra_body={"speculative": spec})
            token_logprobs, tops = r.choices[0].logprobs.token_logprobs, r.choices[0].logprobs.top_logprobs
            text = r.choices[0].text
        assert text == want.text, spec
        assert len(token_logprobs) == len(want.token_ids)
        expect = plain[torch.arange(len(want.token_ids)), torch.tensor(want.token_ids)]
        assert torch.allclose(torch.tensor(token_logprobs), expect, atol=1e-5, rtol=0), spec
        for row, top in zip(plain, tops):  # tokens whose text is equal (partial UTF-8: "\ufffd") share a key
            best = row.topk(3).values
            assert 1 <= len(top) <= 3
            assert all(float((best - v).abs().min()) < 1e-5 for v in top.values())


def test_chat_logprobs_and_top_logprobs(target, client):
    results = []
    for spec in SPECS:
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The cat sat on the mat"}],
            max_tokens=12,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            extra_body={"speculative": spec},
        )
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens
        assert all(
            len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content
        )
        results.append([c.logprob for c in content])
    for other in results[1:]:
        assert torch.allclose(torch.tensor(other), torch.tensor(results[0]), atol=1e-5, rtol=0)


def test_n_samples_share_the_prompt_and_have_their_own_seeds(server, client):
    long_prompt = PROMPT + " " + PROMPT  # > 1 prefix-cache block (32 tokens)
    greedy = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=12, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1  # greedy: n equal answers
    assert greedy.usage.completion_tokens == 36  # 3 x 12, the prompt counted once
    cache = server.engine.core.prefix_cache
    hits = cache.hits
    sampled = client.completions.create(
        model=MODEL, prompt=long_prompt, max_tokens=12, temperature=1.0, n=3, seed=7
    )
    assert cache.hits > hits  # the siblings took the first sample's prompt blocks
    for i, choice in enumerate(sampled.choices):
        alone = client.completions.create(
            model=MODEL, prompt=long_prompt, max_tokens=12, temperature=1.0, seed=7 + i
        )
        assert choice.text == alone.choices[0].text, i
    assert len({c.text for c in sampled.choices}) > 1
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, n=2, stream=True)
    )
    texts = ["", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts[0] == texts[1] == greedy_text(client, PROMPT, 8)


def greedy_text(client, prompt, n):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0).choices[0].text


def test_penalties_greedy_with_speculation_equal_without(client):
    outputs = []
    for spec in SPECS:
        r = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            frequency_penalty=1.5,
            presence_penalty=0.5,
            extra_body={"speculative": spec, "repetition_penalty": 1.2},
        )
        outputs.append(r.choices[0].text)
    assert outputs == [outputs[0]] * len(SPECS)
    assert outputs[0] != greedy_text(client, PROMPT, 24)  # the penalties change this output


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates_and_is_identical_with_speculation(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    texts = []
    for spec in SPECS:
        for prompt in ('{"city": "Paris", "days": 3} {"city": "', "Weather in Rome for two days:"):
            kwargs = dict(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=64,
                temperature=0,
                response_format=fmt,
                extra_body={"speculative": spec},
            )
            if stream:
                chunks = client.chat.completions.create(**kwargs, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                r = client.chat.completions.create(**kwargs)
                assert r.choices[0].finish_reason == "stop"
                text = r.choices[0].message.content
            jsonschema.validate(json.loads(text), SCHEMA)
            texts.append(text)
    half = len(texts) // len(SPECS)
    assert texts == texts[:half] * len(SPECS)


def test_json_object_and_regex_formats(client):
    for spec in SPECS:
        r = client.completions.create(
            model=MODEL,
            prompt="JSON:",
            max_tokens=60,
            temperature=0,
            extra_body={
                "speculative": spec,
                "response_format": {"type": "regex", "pattern": "(yes|no), [0-9]{2}"},
            },
        )
        assert r.choices[0].text in {f"{a}, {n:02d}" for a in ("yes", "no") for n in range(100)}
        c = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Give me a JSON object"}],
            max_tokens=80,
            temperature=0,
            response_format={"type": "json_object"},
            extra_body={"speculative": spec},
        )
        if c.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(c.choices[0].message.content), dict)


def test_usage_reports_per_request_speculation(client):
    r = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"speculative": SPECS[1]}
    )
    spec = r.usage.speculative
    assert spec["num_draft_tokens"] > 0
    assert spec["acceptance_rate"] == pytest.approx(spec["num_accepted_tokens"] / spec["num_draft_tokens"])
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_tokens"] / spec["num_drafts"]
    )
    assert sum(spec["num_accepted_tokens_per_pos"]) == spec["num_accepted_tokens"]
    assert spec["num_verify_forwards"] == r.usage.completion_tokens - spec["num_accepted_tokens"]


def test_bad_combinations_name_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], top_logprobs=2, max_tokens=4
        )
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=MODEL,
            prompt="hi",
            max_tokens=4,
            extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
        )
    assert e.value.body["param"] == "response_format"
