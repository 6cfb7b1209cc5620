"""No request harms another (issue 19): each reproduction of the audit is a test against the real
server on the tiny model, plus the pure verifier's input checks and the sampler's numerics."""

import json
import threading
import time

import httpx
import pytest
import torch

from serving import MODEL, reference, scheduler_held, serve, until
from specdecode import drafters
from specdecode.core.drafter import Drafter, Proposal
from specdecode.core.sampling import Warp, warp
from specdecode.core.tree import Tree
from specdecode.core.tree_verify import verify_tree_greedy, verify_tree_rejection
from specdecode.core.verify import verify_greedy, verify_rejection

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def server(target):
    with serve(target, drafter="ngram", k=4, max_batch=8) as running:
        yield running


def complete(url, client=None, **body):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, **body}
    return (client or httpx).post(url + "/v1/completions", json=body, timeout=60)


def concurrently(*calls, engine=None):
    """Run the calls (HTTP requests) in threads; with `engine`, its steps wait until every request is
    in (running or queued), so they decode in one batch."""
    results = [None] * len(calls)
    gate, real = threading.Event(), None
    if engine is not None:
        real = engine.core.step
        engine.core.step = lambda *a, **k: (gate.wait(30), real(*a, **k))[1]
    else:
        gate.set()

    def run(i, call):
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while engine is not None and len(engine.running) + len(engine.waiting) < len(calls):
            assert time.monotonic() < deadline, "requests did not arrive"
            time.sleep(0.01)
    finally:
        gate.set()
        if real is not None:
            engine.core.step = real
    for t in threads:
        t.join(60)
    return results


# -- sampling numerics ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        Warp(1e-40),
        Warp(1e-38),
        Warp(0.7, top_p=1e-46),
        Warp(1e-45, top_k=3, top_p=1e-30),
    ],
)
def test_warp_is_a_distribution_for_any_valid_parameters(params):
    logits = torch.randn(3, 50) * 30
    probs = warp(logits, params)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(3))
    assert (probs.argmax(-1) == logits.argmax(-1)).all()  # underflowing T acts as greedy; top-p keeps the top


@pytest.mark.parametrize(
    "extra", [{"temperature": 1e-40}, {"temperature": 1e-38}, {"temperature": 0.7, "top_p": 1e-46}]
)
def test_extreme_sampling_parameters_neither_fail_nor_harm_the_batch(target, server, extra):
    want = reference(target, target.tokenizer(PROMPT)["input_ids"], 12).text
    extreme, normal = concurrently(
        lambda: complete(server.url, seed=1, **extra), lambda: complete(server.url), engine=server.engine
    )
    assert extreme.status_code == 200, extreme.text
    assert normal.status_code == 200 and normal.json()["choices"][0]["text"] == want


# -- the verifier refuses bad input ------------------------------------------------------------


def test_verifiers_refuse_out_of_range_ids_and_non_finite_probabilities():
    p = torch.softmax(torch.randn(3, 10), -1)
    with pytest.raises(ValueError, match="out of range"):
        verify_rejection(torch.tensor([-1, 2]), None, p, None)
    with pytest.raises(ValueError, match="out of range"):
        verify_greedy([10, 2], torch.randn(3, 10))
    bad = p.clone()
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        verify_rejection(torch.tensor([1, 2]), None, bad, None)
    with pytest.raises(ValueError, match="finite"):
        verify_rejection(torch.tensor([1, 2]), torch.full((2, 10), float("inf")), p, None)
    tree = Tree([4, 11], [-1, -1])
    with pytest.raises(ValueError, match="out of range"):
        verify_tree_greedy(tree, torch.randn(3, 10))
    with pytest.raises(ValueError, match="finite"):
        verify_tree_rejection(Tree([4, 5], [-1, -1]), None, bad, None)


def test_a_token_its_drafter_gave_probability_zero_is_never_accepted():
    p = torch.full((2, 4), 0.25)
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # the draft is token 0, with q = 0
    for seed in range(50):
        g = torch.Generator().manual_seed(seed)
        assert verify_rejection(torch.tensor([0]), q, p, g).accepted == 0
        g = torch.Generator().manual_seed(seed)
        assert verify_tree_rejection(Tree([0], [-1]), q, p, g).accepted == 0


# -- one request's failure stays its own ---------------------------------------------------------


class BrokenDrafter(Drafter):
    """Proposes token id -1: the verifier refuses it, for this request only."""

    def begin(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        return Proposal(torch.tensor([-1] * k))

    def observe(self, drafted, accepted):
        pass


def test_a_failing_row_fails_its_request_only(target, server):
    key = drafters.parse("ngram:1-1")
    server.engine.pool.templates.put(key, BrokenDrafter())
    try:
        want = reference(target, target.tokenizer(PROMPT)["input_ids"], 12).text
        broken, normal = concurrently(
            lambda: complete(server.url, speculative={"drafter": "ngram:01-1"}),
            lambda: complete(server.url),
            engine=server.engine,
        )
    finally:
        server.engine.pool.templates.pop(key)
    assert broken.status_code == 500 and "out of range" in broken.json()["error"]["message"]
    assert broken.headers["connection"] == "close"
    assert normal.status_code == 200 and normal.json()["choices"][0]["text"] == want
    assert complete(server.url).status_code == 200  # the engine goes on


# -- input problems are 4xx, never 500, and keep the connection usable -----------------------------


@pytest.mark.parametrize(
    "path,body,message",
    [
        (
            "/v1/completions",
            '{"model": "tiny", "prompt": "Hello \\ud800 world", "max_tokens": 4}',
            "valid Unicode",
        ),
        (
            "/v1/chat/completions",
            '{"model": "tiny", "messages": [{"role": "user", "content": "Hi \\udfff"}]}',
            "valid Unicode",
        ),
        (
            "/v1/chat/completions",
            '{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", '
            '"text": "x\\ud800"}]}]}',
            "valid Unicode",
        ),
        (
            "/v1/completions",
            '{"model": "tiny", "prompt": [1, -5, 3], "max_tokens": 4}',
            "greater than or equal to 0",
        ),
        (
            "/v1/completions",
            '{"model": "tiny", "prompt": [1, 99999999], "max_tokens": 4}',
            "token ids must be in",
        ),
        ("/v1/completions", '{"model": "tiny", "prompt": "Hello", "max_tokens": "8"}', "max_tokens"),
        (
            "/v1/chat/completions",
            '{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", '
            '"image_url": {"url": "http://x/y.png"}}]}]}',
            "only text content parts",
        ),
    ],
)
def test_bad_input_is_a_400_and_the_connection_stays_usable(server, path, body, message):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
        assert complete(server.url, client).status_code == 200  # same keep-alive connection


def test_a_json_syntax_error_names_no_parameter(server):
    r = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": "tiny", "prompt": }',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] is None and "not valid JSON" in error["message"]


def test_a_full_queue_answers_429_with_retry_after(target):
    with serve(target, max_batch=1, queue=1, load_control=False) as srv:
        results = concurrently(*[lambda: complete(srv.url, max_tokens=64, ignore_eos=True)] * 6)
    limited = [r for r in results if r.status_code == 429]
    assert limited and all(r.headers.get("retry-after") == "1" for r in limited)
    assert all(r.status_code in (200, 429) for r in results)


# -- shutdown ------------------------------------------------------------------------------------


def test_shutdown_ends_running_streams_with_an_error_event_and_done_and_others_with_503(target):
    """Parked scheduler (lock free): the second request queues, should_exit starts the 0.3 s drain, and
    the engine is stopped while both requests are still in flight, whatever the machine's speed."""
    long = {"max_tokens": 480, "ignore_eos": True, "speculative": {"enabled": False}}
    with serve(target, max_batch=2, load_control=False, drain_s=0.3) as srv:
        plain = []
        with httpx.stream(
            "POST",
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": "Hello", "temperature": 0, "stream": True, **long},
        ) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line).startswith("data: ")
            with scheduler_held(srv.engine):  # neither request can finish before the drain time is up
                t = threading.Thread(target=lambda: plain.append(complete(srv.url, prompt="Hi", **long)))
                t.start()
                until(lambda: len(srv.engine.waiting) == 1)
                srv.server.should_exit = True
                until(lambda: srv.engine.stopping)
            rest = [line for line in lines if line]
        t.join(30)
    assert rest[-1] == "data: [DONE]"
    assert "error" in json.loads(rest[-2][6:])
    assert plain and plain[0].status_code == 503


# -- seeds and labels ------------------------------------------------------------------------------


def test_a_seeded_sampled_request_gives_the_same_text_alone_and_under_load(server):
    seeded = {"temperature": 0.9, "seed": 1234, "max_tokens": 24, "speculative": {"drafter": "ngram", "k": 6}}
    alone = complete(server.url, **seeded).json()["choices"][0]["text"]
    others = [
        lambda i=i: complete(server.url, prompt=f"Other request {i} " * 3, max_tokens=24) for i in range(7)
    ]
    results = concurrently(lambda: complete(server.url, **seeded), *others, engine=server.engine)
    assert results[0].json()["choices"][0]["text"] == alone


def _drafter_labels(server) -> dict[str, float]:
    """drafter label -> draft tokens counted under it, from /metrics."""
    text = httpx.get(server.url + "/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("specdecode:spec_decode_num_draft_tokens_total{"):
            label = line.split('drafter="')[1].split('"')[0]
            out[label] = out.get(label, 0.0) + float(line.split()[-1])
    return out


def test_drafter_labels_come_from_the_configuration_whatever_clients_send(server):
    """The server was started with `ngram` (route) and `none` (candidate): those are labelled by their
    canonical spec; 100 odd specs are each honoured (usage names the spec) but counted under their kind,
    so no client can add labels or push a configured drafter out of its own."""
    for spelling in ("ngram:02-4", "ngram: 2-4", "ngram:2-4"):
        assert complete(server.url, speculative={"drafter": spelling}).status_code == 200
    before = _drafter_labels(server)
    odd = [f"ngram:{1 + i % 3}-{100000 - i}" + (":b=2" if i % 4 == 0 else "") for i in range(100)]
    drafted = 0
    for spec in odd:
        r = complete(server.url, speculative={"drafter": spec}, max_tokens=6)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]["speculative"]
        assert usage["drafter"] == drafters.canonical(spec)  # the request's own spec ran
        drafted += usage["num_draft_tokens"]
    assert complete(server.url).status_code == 200  # the route's drafter, after all the junk
    after = _drafter_labels(server)
    configured = {"ngram:2-4", "none"}
    assert set(after) <= configured | set(drafters.KINDS)  # bounded by configuration and kinds
    assert "ngram:02-4" not in after and "ngram: 2-4" not in after
    assert drafted > 0 and after["ngram"] - before.get("ngram", 0) == drafted  # counted under the kind
    assert after["ngram:2-4"] > before["ngram:2-4"]  # the configured drafter keeps its own label


def test_per_spec_state_stays_bounded_whatever_specs_clients_send(server):
    """Drafter templates, acceptance stats and drafting times are kept per spec: the configured specs'
    for good, 100 odd specs' among at most OTHERS (the latest), so the state does not grow with them."""
    from specdecode.engine.per_spec import OTHERS

    engine = server.engine
    odd = [drafters.parse(f"ngram:{1 + i % 3}-{50000 - i}") for i in range(100)]
    for spec in odd:
        r = complete(server.url, speculative={"drafter": str(spec)}, max_tokens=6)
        assert r.status_code == 200, r.text
    assert complete(server.url).status_code == 200  # the route's drafter, after all the junk
    configured = drafters.parse("ngram")
    for state in (engine.pool.templates, engine.spec_stats, engine.draft_s_per_token):
        assert len(state) <= len(engine.pool.configured) + OTHERS
    assert engine.spec_stats.get(configured).drafted > 0  # the configured drafter's stats stayed
    assert engine.pool.templates.get(configured) is not None
    assert engine.spec_stats.get(odd[-1]) is not None and engine.spec_stats.get(odd[0]) is None


def test_prefix_caching_in_the_server_reuses_a_chat_history_and_keeps_output(target, server):
    system = "You are a careful assistant. " * 12
    first = complete(server.url, prompt=system + "Question one?", max_tokens=8)
    before = httpx.get(server.url + "/metrics").text
    second = complete(server.url, prompt=system + "Question two?", max_tokens=8)
    after = httpx.get(server.url + "/metrics").text
    assert first.status_code == second.status_code == 200

    def hits(text):
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("specdecode:prefix_cache_hits_total")
        )

    assert hits(after) > hits(before)  # the shared system prompt's blocks were reused
    ids = target.tokenizer(system + "Question two?")["input_ids"]
    assert second.json()["choices"][0]["text"] == reference(target, ids, 8).text
