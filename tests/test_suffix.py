"""Suffix decoding (issue 21): the counting suffix trie against a brute-force reference on random
streams (counts, longest match, eviction), proposals, greedy identity of chains, trees and an
ensemble in generate and in the batched core, the spec and the vLLM export."""

import random
from collections import Counter

import pytest
import torch

from specdecode import drafters
from specdecode.backends.batch_model import batched
from specdecode.core.sampling import Warp
from specdecode.decoding.batch_decoder import BatchDecoder, Sequence
from specdecode.decoding.control import AdaptiveK, CostModel, FixedK
from specdecode.decoding.generation import generate
from specdecode.drafters import parse
from specdecode.drafters.suffix import SuffixCache, SuffixDrafter
from specdecode.drafters.suffix_tree import SuffixTrie
from specdecode.errors import UserError


def substring_counts(streams: list[list[int]], depth: int) -> Counter:
    counts = Counter()
    for s in streams:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                counts[tuple(s[i:j])] += 1
    return counts


def trie_counts(trie: SuffixTrie) -> Counter:
    out, stack = Counter(), [((), trie.ROOT)]
    while stack:
        path, node = stack.pop()
        for t, child in trie.children(node).items():
            out[path + (t,)] = trie.count[child]
            stack.append((path + (t,), child))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_counts_match_a_brute_force_reference_under_appends_and_evictions(seed):
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8])
    trie, streams = SuffixTrie(depth), {}
    for _ in range(60):
        key = rng.randrange(6)
        if rng.random() < 0.15 and key in streams:
            trie.remove(key)
            del streams[key]
        else:
            tokens = [rng.randrange(4) for _ in range(rng.randint(1, 6))]  # small alphabet: many repeats
            trie.extend(key, tokens)
            streams.setdefault(key, []).extend(tokens)
        assert trie_counts(trie) == substring_counts(list(streams.values()), depth)
        assert trie.nodes == 1 + len(trie_counts(trie))  # nothing left behind by evictions


def test_a_growing_trie_adds_nothing_for_the_garbage_collector_to_walk():
    # a full collection walks every tracked container: a trie of node objects made a server's
    # collections take 0.3-0.4 s; its flat storage keeps the tracked objects constant as it grows
    import gc

    rng = random.Random(3)
    trie = SuffixTrie(24)
    trie.extend("warm", [rng.randrange(50) for _ in range(10)])
    before = len(gc.get_objects())
    trie.extend("a", [rng.randrange(5000) for _ in range(3000)])
    trie.extend("b", [rng.randrange(50) for _ in range(3000)])
    assert trie.nodes > 50_000
    assert len(gc.get_objects()) - before < 50


def test_longest_match_is_the_longest_suffix_seen_with_a_continuation():
    rng = random.Random(7)
    trie = SuffixTrie(6)
    stream = [rng.randrange(3) for _ in range(200)]
    trie.extend("a", stream)
    for _ in range(50):
        context = [rng.randrange(3) for _ in range(rng.randint(1, 10))]
        node, length = trie.match(context)
        expected = 0
        for n in range(1, min(5, len(context)) + 1):  # a continuation needs room: at most depth - 1
            pattern = context[-n:]
            if any(stream[i : i + n] == pattern for i in range(len(stream) - n)):
                expected = n
        assert length == expected


def test_the_cache_evicts_the_oldest_response():
    cache = SuffixCache(max_tree_depth=4, max_cached_requests=2)
    for key, tokens in enumerate([[1, 2, 3], [4, 5, 6], [7, 8, 9]]):
        cache.extend(key, tokens)
    assert cache.responses() == [[4, 5, 6], [7, 8, 9]]
    assert cache.trie.match([1, 2])[0] is None and cache.trie.match([4, 5])[1] == 2


def test_proposals_follow_the_most_frequent_continuation_above_min_prob():
    trie = SuffixTrie(8)
    trie.extend(0, [1, 2, 3, 9] * 3 + [1, 2, 4, 9])
    node, length = trie.match([5, 1, 2])
    assert length == 2
    tokens, parents, probs = trie.grow(node, 4, 0.1, 1)
    assert tokens == [3, 9, 1, 2] and parents == [-1, 0, 1, 2]
    assert probs[0] == pytest.approx(0.75)
    tree = trie.grow(node, 6, 0.1, 2)
    assert tree[0][:2] == [3, 4] and tree[1][:2] == [-1, -1]  # both continuations as siblings
    assert trie.grow(node, 6, 0.8, 2)[0] == []  # nothing is 80% likely
    drafter = SuffixDrafter(min_token_prob=0.1, branches=2)
    drafter.begin([1, 2, 3, 9] * 3 + [1, 2, 4, 9])
    proposal = drafter.propose([1, 2, 3, 9] * 3 + [1, 2, 4, 9, 1, 2], 6, Warp(), None)
    assert proposal.parents is not None and len(proposal.confidence) == len(proposal.tokens)
    # a tree ranks its nodes by their path probabilities: in (0, 1], never above a node's parent's
    conf = proposal.confidence
    assert all(0.1 <= c <= 1 for c in conf)
    assert all(conf[i] <= conf[p] for i, p in enumerate(proposal.parents) if p >= 0)
    assert sorted(proposal.tokens[[i for i, p in enumerate(proposal.parents) if p < 0]].tolist()) == [3, 4]


def test_speculation_length_follows_the_match_length():
    drafter = SuffixDrafter(max_spec_factor=1.0, min_token_prob=0.0, tree=False)
    prompt = list(range(10, 40)) + [7, 8]
    drafter.begin(prompt)
    context = prompt + list(range(10, 13))  # matches 3 tokens of the prompt
    proposal = drafter.propose(context, 16, Warp(), None)
    assert proposal.tokens.tolist() == [13, 14, 15]  # at most max_spec_factor x 3
    assert drafter.propose(context[:-2] + [99], 16, Warp(), None).tokens.numel() == 0  # no match: nothing


def test_a_one_token_match_proposes_nothing_unless_min_match_allows_it():
    prompt = [1, 2, 3, 9, 4, 5]
    context = prompt + [7, 3]  # only "3" recurs: a one-token pattern, continued by 9
    strict = SuffixDrafter(min_token_prob=0.0, tree=False)
    strict.begin(prompt)
    assert strict.propose(context, 4, Warp(), None).tokens.numel() == 0
    loose = SuffixDrafter(min_token_prob=0.0, tree=False, min_match=1)
    loose.begin(prompt)
    assert loose.propose(context, 4, Warp(), None).tokens.tolist() == [9]
    assert drafters.canonical("suffix:min_match=1") == "suffix:min_match=1"
    with pytest.raises(UserError, match="min_match"):
        drafters.parse("suffix:min_match=0")


def test_previous_responses_are_proposed_in_a_new_request():
    cache = SuffixCache(8)
    first = SuffixDrafter(cache, min_token_prob=0.0)
    first.begin([1, 2])
    first.propose([1, 2, 50, 51, 52, 53, 54, 55], 4, Warp(), None)  # its response so far
    second = SuffixDrafter(cache, min_token_prob=0.0, tree=False)
    second.begin([3, 4, 50, 51])
    assert second.propose([3, 4, 50, 51, 52], 4, Warp(), None).tokens.tolist() == [53, 54, 55]


def test_a_corpus_of_past_responses_is_proposed_from_and_shared_by_copies(target, tmp_path):
    """`suffix:...:PATH`: a third, read-only trie over a `train data` directory's responses (or JSONL):
    its continuations are proposed in any request, a copy (bench forks, server rows) shares it, and
    vLLM's export says it has no equivalent."""
    import copy

    from specdecode import shards
    from specdecode.decoding.config import Route
    from specdecode.export.vllm import Context, export_route

    data = tmp_path / "data"
    data.mkdir()
    shards.write(
        data / "shard-00000.sds", [shards.Record("a", "c", [1], [40, 41, 42, 43, 44, 45])], {"name": "t"}
    )
    drafter = drafters.build(
        f"suffix:tree=0:max_tree_depth=8:min_token_prob=0.05:{data}", drafters.DrafterContext(target)
    )
    assert str(drafters.parse(f"suffix:tree=0:{data}")) == f"suffix:tree=0:{data}"
    drafter.begin([7, 8, 40, 41])
    assert drafter.propose([7, 8, 40, 41, 42], 4, Warp(), None).tokens.tolist() == [43, 44, 45]
    twin = drafter.fork(copy.deepcopy)  # a request's copy: its own cache, the corpus shared
    assert twin.corpus is drafter.corpus and twin.cache is not drafter.cache
    plain = drafters.build(
        "suffix:tree=0:max_tree_depth=8:min_token_prob=0.05", drafters.DrafterContext(target)
    )
    plain.begin([7, 8, 40, 41])
    assert plain.propose([7, 8, 40, 41, 42], 4, Warp(), None).tokens.numel() == 0
    jsonl = tmp_path / "past.jsonl"
    jsonl.write_text('{"response_ids": [40, 41, 42, 43]}\n')
    assert drafters.build(f"suffix:{jsonl}", drafters.DrafterContext(target)).corpus.trie.nodes > 1
    with pytest.raises(UserError, match="neither a `train data` directory nor a JSONL file"):
        drafters.build(f"suffix:{tmp_path / 'missing'}", drafters.DrafterContext(target))
    exported = export_route(Route(parse(f"suffix:tree=0:{data}"), 8, False), Context.__new__(Context), "x")
    assert any("has no vLLM setting: vLLM's suffix cache starts empty" in n for n in exported.notes)
    assert not drafters.parse(f"suffix:{data}").weightless and drafters.parse("suffix").weightless
    ctx = drafters.DrafterContext(target)
    for ids in ([7, 8, 40, 41], [40, 41, 42, 5, 6]):  # greedy output stays plain greedy output
        want = generate(target, drafters.build("none", ctx), ids, max_new_tokens=16).token_ids
        assert generate(target, drafter, ids, k=4, max_new_tokens=16).token_ids == want


@pytest.mark.parametrize(
    "spec", ["suffix", "suffix:tree=0", "suffix:b=2:min_token_prob=0.05", "ensemble:suffix+ngram"]
)
def test_greedy_output_is_plain_greedy_output(target, spec):
    ctx = drafters.DrafterContext(target)
    drafter = drafters.build(spec, ctx)
    plain = drafters.build("none", ctx)
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13, 11, 12, 13, 11], [3, 9, 27, 3, 9]]
    for _ in range(2):  # the second round drafts from the first round's responses too
        for ids in prompts:
            want = generate(target, plain, ids, max_new_tokens=24).token_ids
            got = generate(target, drafter, ids, k=8, max_new_tokens=24)
            assert got.token_ids == want
    assert got.stats.drafted > 0


@pytest.mark.parametrize(
    "policy",
    [
        lambda: FixedK(8),
        lambda: AdaptiveK(CostModel(0.01, {n: 1.0 + 0.06 * n for n in range(1, 13)}), k_max=8),
    ],
    ids=["fixed", "adaptive"],
)
def test_batched_core_gives_single_request_output_with_suffix_trees(target, policy):
    template = drafters.build("suffix:min_token_prob=0.05", drafters.DrafterContext(target))
    prompts = [
        [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
        [11, 12, 13, 11, 12, 13, 11],
        [3, 9, 27, 3, 9],
        [5, 6, 7, 8, 5],
    ]
    want = [
        generate(
            target, drafters.build("none", drafters.DrafterContext(target)), p, max_new_tokens=20
        ).token_ids
        for p in prompts
    ]
    core = BatchDecoder(batched(target.model, 4))
    seqs = [Sequence(p, template.fork(), policy(), Warp(), None, 20) for p in prompts]
    core.start(seqs)
    drafted = 0
    while not all(s.finished for s in seqs):
        running = [s for s in seqs if not s.finished]
        drafted += sum(step.drafted for step in core.step(running))
    assert [s.context[len(s.prompt) :] for s in seqs] == want
    assert drafted > 0 and template.cache.responses()  # the shared cache learned from every sequence


@pytest.mark.parametrize(
    "text,message",
    [
        ("suffix:depth=3", "key=value with keys"),
        ("suffix:tree=2", "tree 0 or 1"),
        ("suffix:max_spec_factor=x", "needs a number"),
        ("suffix:max_tree_depth=1", "max_tree_depth"),
    ],
)
def test_bad_suffix_specs_are_clear_errors(text, message):
    with pytest.raises(UserError, match=message):
        drafters.parse(text)


def test_canonical_form_and_vllm_export():
    from specdecode.decoding.config import Route
    from specdecode.export.vllm import Context, export_route

    assert drafters.canonical("suffix: min_token_prob=0.1 :max_spec_factor=2") == "suffix:max_spec_factor=2.0"
    cfg = export_route(
        Route(parse("suffix:tree=0:max_cached_requests=500"), 32, False), Context.__new__(Context), "x"
    )
    assert cfg.speculative_config == {
        "method": "suffix",
        "num_speculative_tokens": 24,
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 500,
        "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1,
    }
    assert any("min_match=2 has no vLLM setting" in note for note in cfg.notes)
    exact = export_route(Route(parse("suffix:tree=0:min_match=1"), 8, False), Context.__new__(Context), "x")
    assert not any("min_match" in note for note in exact.notes)  # min_match=1 is vLLM's behaviour


def test_memory_is_bounded_by_the_cached_responses():
    cache = SuffixCache(max_tree_depth=6, max_cached_requests=3)
    rng = random.Random(1)
    sizes = []
    for key in range(30):
        cache.extend(key, [rng.randrange(1000) for _ in range(50)])
        sizes.append(cache.nodes)
    assert max(sizes[10:]) <= 3 * 50 * 6 + 1  # at most depth nodes per cached token
    assert torch.tensor(sizes[10:]).float().std() < 100  # flat, not growing


def test_bench_refuses_repeats_that_would_replay_answers_to_a_learning_drafter(capsys):
    from specdecode.cli import main

    assert main(["bench", "--prompts", "agentic:1", "--drafters", "none,suffix", "--repeats", "2"]) == 2
    assert "--passes" in capsys.readouterr().err
    assert drafters.parse("ensemble:suffix+ngram").learns and not drafters.parse("ngram").learns


def test_bench_variants_of_a_learning_drafter_learn_only_from_their_own_answers(target):
    """Bench's rows share one engine: each learning row learns into the suffix cache of its own scope,
    and a run repeated under load starts again from what its row knew before it."""
    from specdecode.bench.suite import Pass, variants

    runs = variants([drafters.parse("suffix"), drafters.parse("ngram")], [4], adaptive=True)
    bench = Pass(target, runs, k_max=4)
    ids = target.tokenizer("def add(a, b):")["input_ids"]
    before = bench.snapshot("suffix")
    bench.run("suffix", ids, "code", 12)
    learned = bench.snapshot("suffix")
    assert learned.responses() and before is None  # the fixed-k row learned its answer ...
    assert bench.snapshot("suffix+adaptive") is None  # ... which its adaptive row must not read
    assert bench.snapshot("ngram:2-4") is None  # a drafter that learns nothing has nothing to keep
    bench.run("suffix", ids, "code", 12)
    bench.restore("suffix", learned)  # the second run is repeated: it must not see its own answer
    assert bench.snapshot("suffix").responses() == learned.responses()
