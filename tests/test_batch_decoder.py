"""The batched decoding core: every sequence of a batch gets the output it gets alone through the
single-sequence loop (greedy), whatever the others in the batch draft: chains, token trees (per-row
tree masks in one forward) or nothing, on the fused Llama batch and on the per-slot HF fallback.
Its sampled path is checked statistically in test_decoder.py (the same test as decode's)."""

from __future__ import annotations

import pytest
import torch

from specdecode.backends.batch_model import BatchedLlama, PerSlotLM, batched
from specdecode.core.sampling import Warp
from specdecode.decoding.batch_decoder import BatchDecoder, Sequence
from specdecode.decoding.control import FixedK
from specdecode.decoding.prefill import PrefillBudget
from specdecode.drafters import NgramDrafter, NoDrafter, parse
from test_decoder import MAX_NEW, cases  # noqa: F401 (cases: the fixture of prompts with clear greedy margins)

DRAFTERS = [NgramDrafter(min_n=1, branches=3), NoDrafter(), NgramDrafter(min_n=1), NgramDrafter(branches=2)]


def together(lm, jobs, k):
    """jobs: (prompt, drafter) decoded as many at a time as lm has slots, joining as others finish
    -> (outputs in order, steps that verified a tree)."""
    core = BatchDecoder(lm)
    seqs = [Sequence(p, d.fork(), FixedK(k), Warp(), None, MAX_NEW) for p, d in jobs]
    waiting, running, trees = list(reversed(seqs)), [], 0
    while waiting or running:
        fresh = [waiting.pop() for _ in range(min(len(core.free), len(waiting)))]
        core.start(fresh)
        running += fresh
        for step in core.step(running):
            trees += step.depth is not None and step.drafted > step.depth
        for seq in [s for s in running if s.finished]:
            core.release(seq)
            running.remove(seq)
    return [s.context[len(s.prompt) :] for s in seqs], trees


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_each_row_equals_plain_greedy_decoding(target, target_hf, cases, backend):
    """Rows join and leave (3 slots), neighbours draft chains, trees or nothing: every output is the
    plain greedy one (the full-recompute reference of test_decoder, also what decode gives alone)."""
    loaded = target if backend == "fast" else target_hf
    lm = batched(loaded.model, 3)
    assert isinstance(lm, BatchedLlama if backend == "fast" else PerSlotLM)
    chosen = cases[:8] if backend == "fast" else cases[:6]
    jobs = [(prompt, DRAFTERS[i % len(DRAFTERS)]) for i, (prompt, _) in enumerate(chosen)]
    outputs, trees = together(lm, jobs, k=4)
    assert trees > 0  # tree rows were verified beside chain rows
    for (prompt, reference), out in zip(chosen, outputs):
        assert out == reference, prompt


def test_tree_rows_with_their_masks_equal_the_single_sequence_tree_forward(target):
    """One batched forward with a tree row and a chain row: the tree row's logits are what the
    single-sequence model gives for the same tree, and keep() leaves the slot as it leaves the model."""
    from specdecode.backends.batch_model import Row
    from specdecode.core.tree import Tree

    model = target.model
    lm = BatchedLlama(model, 2)
    prompt = list(range(5, 25))
    tree = Tree([40, 41, 42, 43, 44], [-1, -1, 1, 2, 0])
    lm.forward([Row(0, torch.tensor(prompt[:-1])), Row(1, torch.tensor(prompt[:9]))])
    tokens = torch.tensor([prompt[-1]] + tree.tokens)
    out = lm.forward(
        [
            Row(1, torch.tensor(prompt[9:14])),
            Row(0, tokens, layers=(-1,), positions=tree.positions(19), tree_mask=tree.mask()),
        ]
    )
    model.reset()
    model.extend(torch.tensor(prompt[:-1]))
    ref = model.forward(tokens, layers=(-1,), positions=tree.positions(19), tree_mask=tree.mask())
    torch.testing.assert_close(out[1].logits, ref.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[1].features, ref.features, atol=1e-4, rtol=1e-4)
    lm.keep(0, 20, [21, 22, 23])
    model.keep(20, [21, 22, 23])
    after = lm.forward([Row(0, torch.tensor([7]))])[0].logits
    torch.testing.assert_close(after, model.extend(torch.tensor([7])), atol=1e-4, rtol=1e-4)


def test_chunked_prefill_keeps_greedy_output_and_lets_others_decode_meanwhile(target, cases):
    """Long prompts go in 5 tokens per step beside a short one that decodes from the first step: every
    output is still the plain greedy one."""
    lm = batched(target.model, 3)
    core = BatchDecoder(lm, budget=PrefillBudget(5))
    (short, short_ref), *rest = cases[:3]
    long_jobs = [(p * 4, None) for p, _ in rest]  # prompts of ~4x the length
    seqs = [Sequence(short, DRAFTERS[0].fork(), FixedK(4), Warp(), None, MAX_NEW)]
    seqs += [Sequence(p, DRAFTERS[1].fork(), FixedK(4), Warp(), None, MAX_NEW) for p, _ in long_jobs]
    core.start(seqs, chunked=True)
    steps_while_prefilling = 0
    while not all(s.finished for s in seqs):
        running = [s for s in seqs if not s.finished]
        steps = core.step(running)
        if any(s.prefilling for s in seqs[1:]):
            steps_while_prefilling += sum(len(st.tokens) for s, st in zip(running, steps) if s is seqs[0])
        assert all(not st.tokens for s, st in zip(running, steps) if st.prefilling)
    assert steps_while_prefilling > 0  # the short request was not frozen behind the long prefills
    assert seqs[0].context[len(short) :] == short_ref
    from specdecode.decoding.generation import generate

    for seq in seqs[1:]:
        alone = generate(target, NoDrafter(), seq.prompt, max_new_tokens=MAX_NEW).token_ids
        assert seq.context[len(seq.prompt) :] == alone


@pytest.mark.parametrize("chunked", [False, True])
def test_prefix_caching_reuses_blocks_and_keeps_greedy_output(target, cases, chunked):
    """Prompts sharing a long prefix (a system prompt, an earlier chat turn): the later ones get the
    cached KV blocks instead of prefilling them, and every output is still plain greedy decoding."""
    from specdecode.decoding.generation import generate
    from specdecode.decoding.prefix_cache import PrefixCache

    shared = [t for p, _ in cases[:4] for t in p]  # ~a few dozen tokens
    prompts = [shared + p for p, _ in cases[4:7]] + [shared[:40]]
    cache = PrefixCache()
    core = BatchDecoder(batched(target.model, 2, block=8), cache, PrefillBudget(16))
    outputs = []
    for prompt in prompts:  # one after another: each finds the blocks the earlier ones stored
        seq = Sequence(prompt, DRAFTERS[0].fork(), FixedK(4), Warp(), None, MAX_NEW)
        core.start([seq], chunked=chunked)
        while not seq.finished:
            core.step([seq])
        core.release(seq)
        outputs.append(seq.context[len(prompt) :])
    assert cache.hits >= 2 * (len(shared) // 8) and cache.hits < cache.queries
    for prompt, out in zip(prompts, outputs):
        assert out == generate(target, NoDrafter(), prompt, max_new_tokens=MAX_NEW).token_ids


@pytest.mark.parametrize("chunked", [False, True])
def test_a_repeated_prompt_prefills_nothing_and_keeps_greedy_output(target, cases, chunked):
    """The part of a prompt after its last full block is cached too: the same prompt again starts
    decoding at once; a prompt that differs only in that part gets the full blocks alone."""
    from specdecode.decoding.generation import generate
    from specdecode.decoding.prefix_cache import PrefixCache

    prompt = [t for p, _ in cases for t in p][:29]  # 3 blocks of 8, then 4 tokens, then the last
    variant = prompt[:26] + [prompt[26] + 1] + prompt[27:]  # differs inside the partial block
    assert len(prompt) == 29
    cache = PrefixCache()
    core = BatchDecoder(batched(target.model, 2, block=8), cache, PrefillBudget(16))
    outputs, reused = [], []
    for p in (prompt, prompt, variant):
        seq = Sequence(p, DRAFTERS[0].fork(), FixedK(4), Warp(), None, MAX_NEW)
        hits = cache.hits
        core.start([seq], chunked=chunked)
        reused.append(cache.hits - hits)
        assert not seq.prefilling or chunked
        while not seq.finished:
            core.step([seq])
        core.release(seq)
        outputs.append(seq.context[len(p) :])
    assert reused == [0, 4, 3]  # the repeat: 3 blocks and the 4-token rest; the variant: the blocks
    assert outputs[0] == outputs[1] == generate(target, NoDrafter(), prompt, max_new_tokens=MAX_NEW).token_ids
    assert outputs[2] == generate(target, NoDrafter(), variant, max_new_tokens=MAX_NEW).token_ids


class _Blocks:
    """A stand-in for a batched model's block pool: blocks of 4 positions, 100 bytes each."""

    block, block_bytes = 4, 100

    def __init__(self):
        self.refs = {}

    def hold(self, blocks):
        for b in blocks:
            self.refs[b] = self.refs.get(b, 0) + 1

    def unhold(self, blocks):
        for b in blocks:
            self.refs[b] -= 1


def test_prefix_cache_evicts_least_recently_used_blocks_within_its_bound():
    from specdecode.decoding.prefix_cache import PrefixCache

    pool = _Blocks()
    cache = PrefixCache(max_bytes=200).bind(pool)
    cache.store(list(range(8)), [10, 11])  # blocks A, AB: held, not copied
    assert pool.refs == {10: 1, 11: 1} and cache.lookup(list(range(9))) == [(10, 4), (11, 4)]
    cache.store([9, 9, 9, 9], [12])  # a third block lets the least recently used go
    assert cache.bytes == 200 and len(cache.blocks) == 2 and pool.refs[10] == 0
    assert cache.lookup([9, 9, 9, 9]) == [(12, 4)]
    assert cache.evict() and cache.evict() and not cache.evict() and sum(pool.refs.values()) == 0


def test_a_partial_last_block_is_found_only_by_a_prompt_that_ends_where_it_did():
    from specdecode.decoding.prefix_cache import PrefixCache

    cache = PrefixCache().bind(_Blocks())
    cache.store(list(range(10)), [1, 2, 3])  # blocks 0-3, 4-7 and the partial 8-9
    assert cache.lookup(list(range(10))) == [(1, 4), (2, 4), (3, 2)]
    assert cache.lookup(list(range(9)) + [99]) == [(1, 4), (2, 4)]  # its rest differs
    assert cache.lookup(list(range(12))) == [(1, 4), (2, 4)]  # 8-11 is a full block: not stored
    assert cache.lookup(list(range(9))) == [(1, 4), (2, 4)]  # a shorter rest: not stored


def test_prefill_chunks_shrink_as_the_context_grows_so_a_steps_cost_stays_within_the_budget():
    from specdecode.decoding.prefill import chunk_cost, chunk_size

    sizes = [chunk_size(512, start, 10_000, 3072.0) for start in (0, 1000, 2000, 4000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 2 * sizes[-1]
    for start, n in zip((0, 1000, 2000, 4000), sizes):
        assert chunk_cost(n, start, 3072.0) <= 512 < chunk_cost(n + 1, start, 3072.0)  # the most that fits
    assert chunk_size(512, 0, 100, 3072.0) == 100  # never more than the prompt has left
    assert chunk_size(0.5, 9000, 10, 3072.0) == 1  # always progress
    assert chunk_size(512, 4000, 10_000, None) == 512 and chunk_cost(7, 4000, None) == 7  # no span: tokens


def test_the_batched_model_knows_its_attention_span(target):
    from transformers import LlamaConfig

    from specdecode.backends.batch_model import attention_span

    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    assert attention_span(cfg, 9, 3, 64) == 3072.0  # SmolLM2-135M: 3.54M weights a layer / (2 * 576)
    lm = batched(target.model, 2)
    cfg = target.model.config
    assert lm.attention_span == attention_span(
        cfg, target.model.heads, target.model.kv_heads, target.model.head_dim
    )


def test_admission_claims_cache_memory_and_a_request_waits_until_it_is_there(target, cases):
    """A sequence is admitted when its prompt, max_new_tokens and a tree's slack fit the KV memory's
    unclaimed blocks; the next one waits (nothing claimed for it) until the first leaves; one that
    could never fit is refused by the engine with a clear error, never an out-of-memory kill."""
    from specdecode.backends.batch_model import kv_bytes_per_token
    from specdecode.decoding.batch_decoder import positions
    from specdecode.engine import Request, TooLarge, build_engine, default_routes

    per_block = 64 * kv_bytes_per_token(target.model)
    lm = batched(target.model, 3, kv_memory=6 * per_block)  # 6 blocks of 64 positions
    core = BatchDecoder(lm)
    prompt = list(range(5, 200))
    first = Sequence(prompt, NoDrafter().fork(), FixedK(1), Warp(), None, 60)  # 195 + 60 + 64: 5 blocks
    second = Sequence(prompt, NoDrafter().fork(), FixedK(1), Warp(), None, 60)
    assert positions(first) == 319 and core.admit(first) and not core.admit(second)
    assert second.slot is None and lm.pool.unclaimed() == 1
    core.start([first], chunked=True)
    while not first.finished:
        core.step([first])
    alone = first.context[len(prompt) :]
    core.release(first)
    assert lm.pool.in_use() == 0 and core.admit(second)  # the first's blocks and claim came back
    core.start([second])
    while not second.finished:
        core.step([second])
    assert second.context[len(prompt) :] == alone
    assert core.room(len(prompt)) == 6 * 64 - 64 - len(prompt)
    engine = build_engine(
        target, default_routes(parse("none"), 1, False), model_name="t", max_batch=2, load_control=False,
        kv_memory=6 * per_block,
    )  # fmt: skip
    with pytest.raises(TooLarge, match="at most 125 new tokens after this prompt"):
        engine.submit(Request(prompt, Warp(), 126), lambda event: None)


def test_a_long_prompt_admitted_beside_a_running_row_moves_nothing(target, cases):
    """A long prompt admitted beside a decoding row takes blocks of its own: the running row's blocks
    and the pool's tensors stay where they are (nothing is grown or copied), and every output is the
    one each request gets alone."""
    from specdecode.decoding.generation import generate

    lm = batched(target.model, 3)
    core = BatchDecoder(lm, budget=PrefillBudget(64))
    short, short_ref = cases[0]
    running = Sequence(short, DRAFTERS[0].fork(), FixedK(3), Warp(), None, MAX_NEW)
    core.start([running], chunked=True)
    core.step([running])
    pool_k, first_block = lm.k_cache, lm.pool.owned[running.slot][0]
    prompt = (cases[1][0] * 64)[:300]
    admitted = Sequence(prompt, NoDrafter().fork(), FixedK(1), Warp(), None, MAX_NEW)
    core.start([admitted], chunked=True)
    while not (running.finished and admitted.finished):
        core.step([s for s in (running, admitted) if not s.finished])
        assert lm.k_cache is pool_k and lm.pool.owned[running.slot][0] == first_block
    assert running.context[len(short) :] == short_ref
    alone = generate(target, NoDrafter(), prompt, max_new_tokens=MAX_NEW).token_ids
    assert admitted.context[len(prompt) :] == alone


def test_a_prompt_alone_goes_in_whole_chunks_and_beside_decoding_rows_as_the_budget_allows(target):
    """The chunk a step carries is the one prefill.py's budget gives for that step's decode work: alone
    (nothing decodes) the idle budget, beside a decoding row the live one, smaller; deeper into the
    prompt the same budget buys fewer tokens; the prompt advances every step."""
    from specdecode.decoding.prefill import IDLE_PREFILL, chunk_cost, chunk_size

    lm = batched(target.model, 2)
    span = lm.attention_span
    core = BatchDecoder(lm, budget=PrefillBudget(32))
    prompt = [5 + i % 300 for i in range(395)]
    seq = Sequence(prompt, NoDrafter().fork(), FixedK(1), Warp(), None, 4)
    core.start([seq], chunked=True)
    core.step([seq])
    assert seq.prefilled == chunk_size(32 * IDLE_PREFILL, 0, len(prompt) - 1, span) > 4 * 32
    core.release(seq)

    running = Sequence([7, 8, 9], NoDrafter().fork(), FixedK(1), Warp(), None, 200)
    core.start([running])
    seq = Sequence(prompt, NoDrafter().fork(), FixedK(1), Warp(), None, 4)
    core.start([seq], chunked=True)
    chunks = []
    while seq.prefilling:
        now = core.budget.span(span)  # the model's, until steps beside decoding have measured it
        work = core.budget.work(chunk_cost(1, len(running.context) - 1, now))  # the running row's one token
        before = seq.prefilled
        core.step([running, seq])
        assert seq.prefilled - before == chunk_size(work, before, len(prompt) - 1 - before, now) >= 1
        chunks.append(seq.prefilled - before)
    assert max(chunks) <= 32 < len(prompt) - 1  # never more than --prefill-chunk beside a decoding row
    # the decoding row beside the chunks decodes what it decodes alone; compared over its first 64 tokens:
    # how many it made depends on the live budget (timing), and this fp32 model's batched rows and a
    # prompt prefilled alone by SDPA agree to ~2e-5, not to the bit (make_llama), which at this prompt
    # diverged from it at its 102nd token (the attention kernel's rounding changed in stop 43)
    n = min(len(running.context) - 3, 64)
    assert running.context[3 : 3 + n] == generate_alone(target, [7, 8, 9], n)


def generate_alone(target, prompt, n):
    from specdecode.decoding.generation import generate

    return generate(target, NoDrafter(), prompt, max_new_tokens=n).token_ids


def test_an_unchunked_start_prefills_in_forwards_of_bounded_rows(target, cases, monkeypatch):
    """start(chunked=False) (the Python API) prefills before returning, in forwards of at most
    PREFILL_ROWS prompt tokens (shortest rest first), so a long prompt's activations stay bounded;
    the outputs are each prompt's alone."""
    from specdecode.decoding import batch_decoder
    from specdecode.decoding.generation import generate

    monkeypatch.setattr(batch_decoder, "PREFILL_ROWS", 24)
    lm = batched(target.model, 2)
    sizes, forward = [], lm.forward
    monkeypatch.setattr(
        lm, "forward", lambda rows: sizes.append(sum(len(r.tokens) for r in rows)) or forward(rows)
    )
    core = BatchDecoder(lm)
    prompts = [(cases[1][0] * 8)[:70], cases[0][0]]
    seqs = [Sequence(p, NoDrafter().fork(), FixedK(1), Warp(), None, MAX_NEW) for p in prompts]
    core.start(seqs)
    assert (
        not any(s.prefilling for s in seqs)
        and max(sizes) <= 24
        and sum(sizes) == sum(len(p) - 1 for p in prompts)
    )
    while not all(s.finished for s in seqs):
        core.step([s for s in seqs if not s.finished])
    for seq in seqs:
        assert (
            seq.context[len(seq.prompt) :]
            == generate(target, NoDrafter(), seq.prompt, max_new_tokens=MAX_NEW).token_ids
        )


def test_preempted_sequences_give_their_memory_up_and_recompute_to_the_same_output(target, cases):
    """Admission claims a prompt and its next `grow` tokens only. Where the running sequences' next
    steps need more blocks than the pool has, the last admitted is preempted (its slot and blocks given
    back, its output kept) and, admitted again when memory frees, fills in its prompt and output again
    and goes on to the output it gets alone: chains, trees and plain rows."""
    from specdecode.backends.batch_model import kv_bytes_per_token
    from specdecode.backends.kv_pool import blocks_for
    from specdecode.decoding.batch_decoder import TREE_SLACK, positions

    block, jobs = 8, [(p, ref, d) for (p, ref), d in zip(cases[:4], DRAFTERS)]
    claimed = [
        blocks_for(positions(Sequence(p, d, FixedK(3), Warp(), None, MAX_NEW), 0), block) for p, _, d in jobs
    ]
    alone = max(blocks_for(len(p) + MAX_NEW + TREE_SLACK, block) for p, _, _ in jobs)
    usable = max(sum(claimed) + 1, alone)  # everyone admitted, not everyone's output fits
    lm = batched(target.model, 4, kv_memory=usable * block * kv_bytes_per_token(target.model), block=block)
    core = BatchDecoder(lm, grow=0)
    seqs = [Sequence(p, d.fork(), FixedK(3), Warp(), None, MAX_NEW) for p, _, d in jobs]
    waiting, running = list(seqs), []
    while waiting or running:
        for seq in core.reserve(running):  # the last admitted first: each goes to the queue's front
            assert seq.slot is None and seq.generated > 0
            running.remove(seq)
            waiting.insert(0, seq)
        fresh = []
        while waiting and core.admit(waiting[0]):
            fresh.append(waiting.pop(0))
        assert running or fresh, "nothing runs and the first in line cannot be admitted"
        core.start(fresh, chunked=True)
        running += fresh
        core.step(running)
        for seq in [s for s in running if s.finished]:
            core.release(seq)
            running.remove(seq)
    assert sum(seq.preempted for seq in seqs) >= 1
    assert [s.context[len(s.prompt) :] for s in seqs] == [ref for _, ref, _ in jobs]
    assert lm.pool.in_use() == 0 and sum(lm.pool.claims) == 0
