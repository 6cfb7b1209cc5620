"""Greedy speculation on a GGUF target through every way in that batches: the Python API (the batched
core) and the server. The tiny GGUF Llama runs at `gguf-exact` everywhere and at `gguf` (8-bit
activations) where AVX-512 VNNI makes every row's bits independent of the batch; batched speculative
answers must equal each prompt decoded alone without speculation, and speculation must have happened
(drafts proposed and some accepted), or the identity would say nothing."""

import threading
from functools import partial

import httpx
import pytest
import torch

from conftest import make_llama, make_tokenizer
from gguf_fixtures import write_tiny_gguf
from helpers import assert_lossless, record_proposals
from serving import MODEL, reference, scheduler_held, serve, until
from specdecode import LLM, SamplingParams, drafters
from specdecode.backends import kernels, models
from specdecode.backends.precision import Precision
from specdecode.errors import UserError

ops = kernels.load()
DTYPES = [
    pytest.param("gguf-exact", marks=pytest.mark.skipif(ops is None, reason="no C++ compiler: no kernels")),
    pytest.param(
        "gguf",
        marks=pytest.mark.skipif(ops is None, reason="no C++ compiler: no kernels"),
    ),
]
# repetitive prompts: n-gram lookup has something to propose on a random tiny model
PROMPTS = [
    "the cat sat on the mat. the cat sat on the",
    "1 2 3 1 2 3 1 2 3 1 2",
    "def f(x): return x def f(x):",
]
TYPES = {"attn_q": "Q4_0", "attn_k": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "Q5_0", "output": "Q8_0"}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDECODE_CACHE", str(tmp_path_factory.mktemp("cache")))
        tok = make_tokenizer()
        hf = make_llama(seed=3, hidden=128, heads=4, kv_heads=2, intermediate=256, eos_id=tok.eos_token_id)
        yield write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hf, tok, TYPES)


@pytest.mark.parametrize("dtype", DTYPES)
def test_api_batched_speculation_on_gguf_equals_plain_alone(tiny_gguf, tiny_draft_dir, dtype):
    """n-gram lookup (mostly rejected on a random model: the rejection path), the tiny draft model, and
    the file drafting for itself (accepted: the acceptance path, a bonus token each full step)."""
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [
        o.token_ids for o in (LLM(tiny_gguf, "none", dtype=dtype).generate(p, greedy)[0] for p in PROMPTS)
    ]
    accepted = 0
    for drafter in ("ngram", f"draft:{tiny_draft_dir}", f"draft:{tiny_gguf}"):
        batched = LLM(tiny_gguf, drafter, k=4, max_batch=2, dtype=dtype).generate(PROMPTS, greedy)  # 2 slots
        assert [o.token_ids for o in batched] == alone, drafter
        assert sum(o.metrics.drafted for o in batched) > 0, drafter
        accepted += sum(o.metrics.accepted for o in batched)
    assert accepted > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_int8_kv_cache_keeps_batched_speculation_equal_to_plain_alone_at_int8(tiny_gguf, dtype):
    """A KV precision is part of "the same target": at --kv-dtype int8, chains and trees of drafts in a
    batch give what plain decoding alone gives at int8."""
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(tiny_gguf, "none", dtype=dtype, kv_dtype="int8")
    alone = [o.token_ids for o in (plain.generate(p, greedy)[0] for p in PROMPTS)]
    for drafter in ("ngram", f"draft:b=2:{tiny_gguf}"):
        llm = LLM(tiny_gguf, drafter, k=4, max_batch=2, dtype=dtype, kv_dtype="int8")
        batched = llm.generate(PROMPTS, greedy)
        assert [o.token_ids for o in batched] == alone, drafter
        assert sum(o.metrics.accepted for o in batched) > 0 or drafter == "ngram"


@pytest.mark.parametrize("dtype", DTYPES)
def test_server_batched_speculation_on_gguf_equals_plain_alone(tiny_gguf, dtype):
    """The server's batched core with the file drafting for itself: drafts proposed and accepted."""
    target = models.load(tiny_gguf, Precision.parse(dtype), "cpu")
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS]
    expected = [reference(target, ids, 24).token_ids for ids in prompts]
    results = [None] * len(prompts)

    def ask(i, url):
        body = {"model": MODEL, "prompt": prompts[i], "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        results[i] = httpx.post(url + "/v1/completions", json=body, timeout=60).json()

    with serve(target, drafter=f"draft:{tiny_gguf}", k=4, max_batch=4, load_control=False) as srv:
        with scheduler_held(srv.engine):  # every request in before the first step: one batch
            threads = [threading.Thread(target=ask, args=(i, srv.url)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            until(lambda: len(srv.engine.waiting) == len(prompts))
        for t in threads:
            t.join(60)
    texts = [r["choices"][0]["text"] for r in results]
    assert texts == [target.tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]
    usage = [r["usage"]["speculative"] for r in results]
    assert sum(u["num_draft_tokens"] for u in usage) > 0
    assert sum(u["num_accepted_tokens"] for u in usage) > 0


@pytest.mark.parametrize("tree", ["", "b=2:"], ids=["chain", "tree"])
@pytest.mark.parametrize("dtype", ["fp32", *DTYPES])
def test_a_draft_over_its_most_frequent_tokens_drafts_only_them_and_stays_lossless(tiny_gguf, dtype, tree):
    """FR-Spec: `draft:vocab=N:<model>` keeps the draft's LM-head rows of its first N tokens (and its
    specials); it proposes only those, in chains and trees, verification is unchanged, the output stays
    plain decoding's."""
    target = models.load(tiny_gguf, Precision.parse(dtype), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse(dtype))
    drafter = drafters.build(f"draft:{tree}vocab=200:{tiny_gguf}", ctx)
    allowed = set(drafter.token_map.tolist())
    assert set(range(200)) <= allowed and len(allowed) < target.model.vocab_size
    assert drafter.model.vocab_size == len(allowed) < target.model.vocab_size  # the head's rows, only
    proposals = record_proposals(drafter)
    plain = drafters.build("none", ctx)
    assert_lossless(target, plain, drafter, PROMPTS, k=4, max_new_tokens=24)  # some accepted
    proposed = [t for p in proposals for t in p.tokens.tolist()]
    assert proposed and set(proposed) <= allowed


def test_a_draft_chain_with_a_confidence_stop_stays_lossless(tiny_gguf):
    """`draft:stop=P:<model>` ends chains whose draft confidence falls below P%: shorter proposals,
    the same output as plain decoding; a stop of 100% or on a static tree is refused by name."""
    target = models.load(tiny_gguf, Precision.parse("fp32"), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse("fp32"))
    drafter = drafters.build(f"draft:vocab=200:stop=5:{tiny_gguf}", ctx)
    assert drafter.stop.fixed == 0.05
    proposals = record_proposals(drafter)
    assert_lossless(target, drafters.build("none", ctx), drafter, PROMPTS, k=4, max_new_tokens=24)
    lengths = [p.tokens.numel() for p in proposals]
    assert lengths and min(lengths) >= 1 and min(lengths) < 4  # some chains stopped early
    for bad, match in [
        (f"draft:stop=100:{tiny_gguf}", "below 100"),
        (f"draft:b=2:stop=30:{tiny_gguf}", "not a static one"),
    ]:
        with pytest.raises(UserError, match=match):
            drafters.build(bad, ctx)


def test_stop_auto_is_the_measured_cost_of_a_draft_pass_and_a_verification_row(tiny_gguf, monkeypatch):
    """`draft:stop=auto:<model>` prices a chain's rows at v and its draft passes at c from chain_costs
    (in target steps), timed on forks of both models: neither the target's cache nor the draft's
    changes; a chain keeps a token while its odds pay v and drafts on while they pay c + v, so a draft
    pass of a whole step or more drafts one token at most; a dynamic tree is priced alike."""
    from specdecode.drafters.draft_model import chain_costs

    target = models.load(tiny_gguf, Precision.parse("fp32"), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse("fp32"))
    target.model.extend(torch.tensor([1, 2, 3]))
    c, v = chain_costs(target.model, target.model)  # a model against itself
    assert 0.5 < c < 2.0 and 0.0 <= v < 1.0 and target.model.length == 3
    drafter = drafters.build(f"draft:stop=auto:{tiny_gguf}", ctx)
    assert 0.0 < drafter.stop.cost and 0.0 <= drafter.stop.row < 1.0
    assert target.model.length == 3 and drafter.cached == []
    seen = []
    monkeypatch.setattr(drafters, "chain_costs", lambda draft, tgt: seen.append((draft, tgt)) or (0.25, 0.1))
    stop = drafters.build(f"draft:vocab=200:stop=auto:{tiny_gguf}", ctx).stop
    keep, go_on = stop.bars(3)
    assert keep == pytest.approx([0.1] * 3) and go_on == pytest.approx([0.35] * 3)  # v; c + v
    assert seen[0][1] is target.model and seen[0][0].vocab_size < target.model.vocab_size  # the cut head
    monkeypatch.setattr(drafters, "chain_costs", lambda draft, tgt: (3.0, 0.2))
    tree_stop = drafters.build(f"draft:b=2:nodes=6:stop=auto:{tiny_gguf}", ctx).stop
    keep, go_on = tree_stop.bars(2)
    assert keep == pytest.approx([0.2] * 2) and go_on == pytest.approx([3.2] * 2)  # a row; a pass and a row


def test_ngram_chains_cut_by_their_record_stay_lossless(tiny_gguf):
    """`ngram:stop=P` and `fallback:ngram:stop=P+...`: greedy output is plain decoding's (fp32), and the
    stop does cut chains (some proposals shorter than k though the lookup offered more)."""
    target = models.load(tiny_gguf, Precision.parse("fp32"), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse("fp32"))
    plain = drafters.build("none", ctx)
    drafter = drafters.build("ngram:1-3:stop=40", ctx)
    proposals = record_proposals(drafter)
    # this random model rejects the lookups, so their record soon cuts them to nothing: the accepting
    # path is the fallback's below, whose draft (the target itself) is accepted
    assert_lossless(target, plain, drafter, PROMPTS, k=6, max_new_tokens=24, min_accepted=0)
    assert any(0 < p.tokens.numel() < 6 for p in proposals)
    assert_lossless(
        target,
        plain,
        drafters.build(f"fallback:ngram:1-3:stop=40+draft:{tiny_gguf}", ctx),
        PROMPTS,
        k=6,
        max_new_tokens=24,
    )


def test_a_dynamic_draft_tree_with_a_confidence_stop_stays_lossless(tiny_gguf):
    """`draft:b=B:nodes=N:stop=P:<model>`: the tree stops growing where no path reaches P%; greedy
    output is plain decoding's (fp32)."""
    target = models.load(tiny_gguf, Precision.parse("fp32"), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse("fp32"))
    drafter = drafters.build(f"draft:b=2:nodes=6:vocab=200:stop=5:{tiny_gguf}", ctx)
    assert drafter.stop.fixed == 0.05 and drafter.nodes == 6
    proposals = record_proposals(drafter)
    assert_lossless(target, drafters.build("none", ctx), drafter, PROMPTS, k=4, max_new_tokens=24)
    assert proposals and all(1 <= p.tokens.numel() <= 6 for p in proposals)


def test_a_dynamic_draft_tree_priced_by_its_rows_stays_lossless(tiny_gguf):
    """`draft:b=B:nodes=N:stop=auto:<model>`: nodes kept while they pay their rows, levels grown while
    the best frontier path pays a draft pass and a row (growth.dynamic); greedy output is plain
    decoding's (fp32), and no proposal exceeds the node budget."""
    target = models.load(tiny_gguf, Precision.parse("fp32"), "cpu")
    ctx = drafters.DrafterContext(target, Precision.parse("fp32"))
    drafter = drafters.build(f"draft:b=2:nodes=6:vocab=200:stop=auto:{tiny_gguf}", ctx)
    assert drafter.stop.active and not drafter.stop.fixed
    proposals = record_proposals(drafter)
    assert_lossless(target, drafters.build("none", ctx), drafter, PROMPTS, k=4, max_new_tokens=24)
    assert proposals and all(p.tokens.numel() <= 6 for p in proposals)


def run_in_cache(target, requests, kv_blocks: int | None, window: int, drafter: str = "ngram"):
    """The requests through an engine of 3 slots (serving `drafter` and none, k 4) whose KV cache holds
    `kv_blocks` blocks (None: room to spare), `window` submitted at a time -> ({id(request): Done},
    preemptions). A request drafts with its own `drafter` (ngram by default)."""
    from specdecode.backends.batch_model import kv_bytes_per_token
    from specdecode.backends.kv_pool import BLOCK
    from specdecode.engine import build_engine, default_routes
    from specdecode.engine.client import complete

    engine = build_engine(
        target, default_routes(drafters.parse(drafter), 4, False), model_name="t", max_batch=3,
        load_control=False, prefix_cache_mb=0,
        kv_memory=kv_blocks and kv_blocks * BLOCK * kv_bytes_per_token(target.model),
    )  # fmt: skip
    done = {id(r): c.done for r, c in complete(engine, requests, window=window)}
    return done, engine.metrics.preemptions.labels("t")._value.get()


def plain_engine(target, max_batch: int):
    """An engine decoding plainly (no drafter), `max_batch` slots, no measured costs."""
    from specdecode.engine import build_engine, default_routes

    return build_engine(
        target,
        default_routes(drafters.parse("none"), 4, False),
        model_name="t",
        max_batch=max_batch,
        load_control=False,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_requests_preempted_for_cache_memory_recompute_to_the_output_they_get_alone(tiny_gguf, dtype):
    """Three requests of 400 new tokens in a KV cache of 13 blocks of 64 positions: two are admitted
    (each claims its prompt and 256 new tokens), and when the first grows past its claim the second is
    preempted, waits at the front of the queue and recomputes its output when the first is done. Every
    request, greedy or seeded sampled, gets the tokens it gets alone in an engine with room to spare."""
    from specdecode.core.sampling import Warp
    from specdecode.engine import Request

    target = models.load(tiny_gguf, Precision.parse(dtype), "cpu")
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS]

    def run(kv_blocks: int | None, window: int):
        requests = [
            Request(ids, Warp(0.8) if i == 1 else Warp(), 400, seed=7 if i == 1 else None, ignore_eos=True)
            for i, ids in enumerate(prompts)
        ]
        done, preempted = run_in_cache(target, requests, kv_blocks, window)
        return [done[id(r)].tokens for r in requests], preempted

    alone, none = run(None, 1)
    together, preempted = run(13, 3)
    assert none == 0 and preempted >= 1
    assert together == alone and all(len(t) == 400 for t in alone)


@pytest.mark.parametrize("dtype", DTYPES)
def test_captured_features_are_the_teacher_forced_forwards_rows_through_drafts_and_preemption(
    tiny_gguf, dtype, tmp_path
):
    """Request.capture (what `train data --capture` stores): every position but the last of prompt and
    completion, the final norm's rows and a layer's, the same bits as one teacher-forced forward over
    the whole sequence, whether the request ran alone or was preempted and recomputed, with drafts
    accepted and rejected on the way. The drafts come from a corpus of this machine's own plain answers
    with every fifth token changed (`suffix:PATH`): a random tiny model's text need not repeat itself for
    n-gram lookup, and which text it writes depends on the ISA's rounding outside the tiles."""
    import json

    from specdecode.core.sampling import Warp
    from specdecode.engine import Request

    target = models.load(tiny_gguf, Precision.parse(dtype), "cpu")
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS]
    none = drafters.parse("none")
    plain, _ = run_in_cache(
        target, [Request(ids, Warp(), 400, drafter=none, ignore_eos=True) for ids in prompts], None, 3
    )
    corpus, vocab = tmp_path / "answers.jsonl", target.model.config.vocab_size
    changed = [[(t + 1) % vocab if i % 5 == 4 else t for i, t in enumerate(d.tokens)] for d in plain.values()]
    corpus.write_text("".join(json.dumps({"response_ids": answer}) + "\n" for answer in changed))
    suffix = drafters.parse(f"suffix:{corpus}")

    def run(kv_blocks: int | None, window: int):
        requests = [
            Request(ids, Warp(), 400, drafter=suffix, ignore_eos=True, capture=(-1, 1)) for ids in prompts
        ]
        done, preempted = run_in_cache(target, requests, kv_blocks, window, str(suffix))
        assert preempted >= (1 if kv_blocks else 0)
        stats = [d.stats for d in done.values()]
        assert sum(s.accepted for s in stats) > 0  # drafts were kept, and fed
        assert sum(s.drafted - s.accepted for s in stats) > 0  # and rejected, and rolled back
        return [done[id(r)] for r in requests]

    alone, together = run(None, 1), run(13, 3)
    hidden = target.model.config.hidden_size
    # gguf's tiles give a row the same bits in any forward; gguf-exact's float GEMMs (a preempted
    # request's recomputed prefill, a long forward) round in another order
    same = torch.equal if dtype == "gguf" else partial(torch.allclose, rtol=1e-4, atol=1e-4)
    for ids, a, b in zip(prompts, alone, together):
        assert a.tokens == b.tokens
        tokens = torch.tensor(ids + a.tokens[:-1])
        assert a.features.shape == (len(tokens), 2 * hidden)
        target.model.reset()
        whole = target.model.forward(tokens, num_logits=1, layers=(-1, 1)).features.float()
        assert same(a.features, b.features) and same(a.features, whole)
    target.model.reset()


def test_a_capture_of_a_layer_the_target_lacks_is_the_requests_error(tiny_gguf):
    from specdecode.core.sampling import Warp
    from specdecode.engine import Request

    engine = plain_engine(models.load(tiny_gguf, Precision.parse("fp32"), "cpu"), 1)
    with pytest.raises(UserError, match="capture: layers \\[5\\] out of range for a target of 2 layers"):
        engine.submit(Request([1, 2, 3], Warp(), 4, capture=(5,)), lambda event: None)


def test_a_capturing_request_cancelled_before_its_prefill_ends_without_features(target):
    """An aborted request has no complete rows to give: its Done carries none, and the engine goes on."""
    from specdecode.core.sampling import Warp
    from specdecode.engine import Request
    from specdecode.engine.request import Collected

    engine = plain_engine(target, 2)
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    cancelled, served = Collected(), Collected()
    engine.cancel(engine.submit(Request(ids, Warp(), 8, capture=(-1,)), cancelled.add))
    engine.submit(Request(ids, Warp(), 8, capture=(-1,)), served.add)
    while not served.finished:
        engine.iterate()
    assert cancelled.done.finish_reason == "abort" and cancelled.done.features is None
    assert served.done.features.shape == (len(ids) + 8 - 1, target.model.config.hidden_size)
