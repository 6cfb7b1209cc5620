"""The decoder loop: greedy speculative output is token-identical to plain greedy decoding for every
drafter and k; bookkeeping (stats, EOS, max_new_tokens, KV-cache invariant); and, through the real loop
on table models, sampled output is distributed exactly as the target's distribution: through the
single-sequence loop and through the batched core (the server's step), which share step.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from helpers import DELTA, TableModel, joint_two, tv, tv_bound
from specdecode.backends.batch_model import PerSlotLM
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.models import HFModel, LoadedModel
from specdecode.core.metrics import Stats
from specdecode.core.sampling import Warp, warp
from specdecode.core.verify import Verdict
from specdecode.decoding import step as step_module
from specdecode.decoding.batch_decoder import BatchDecoder, Sequence
from specdecode.decoding.control import FixedK
from specdecode.decoding.decoder import decode
from specdecode.decoding.generation import generate
from specdecode.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specdecode.errors import UserError

GREEDY = Warp()
MAX_NEW = 20
MIN_MARGIN = 1e-3  # top-1 minus top-2 logit; batched and one-token forwards differ by ~2e-5


def run(model, drafter, prompt, k, params=GREEDY, max_new_tokens=MAX_NEW, eos_ids=frozenset(), seed=0):
    """All steps of one decode; returns (committed tokens, steps)."""
    g = torch.Generator().manual_seed(seed)
    steps = list(
        decode(
            model,
            drafter,
            prompt,
            k=k,
            params=params,
            max_new_tokens=max_new_tokens,
            eos_ids=eos_ids,
            generator=g,
        )
    )
    return [t for s in steps for t in s.tokens], steps


@torch.inference_mode()
def full_recompute_greedy(hf, prompt, n):
    """Reference greedy decoding without any cache: a full forward of the whole sequence per token.
    Returns the tokens and the smallest top-1/top-2 logit margin met on the way."""
    seq, margin = list(prompt), float("inf")
    for _ in range(n):
        logits = hf(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top = logits.topk(2).values
        margin = min(margin, float(top[0] - top[1]))
        seq.append(int(logits.argmax()))
    return seq[len(prompt) :], margin


def make_prompts(count=14, vocab=384, seed=0):
    """Seeded prompts of length 3..40; every other one repeats a short motif, so n-gram lookup fires."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        length = int(torch.randint(3, 41, (1,), generator=g))
        if i % 2:
            motif = torch.randint(
                3, vocab, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g
            ).tolist()
            prompts.append((motif * 20)[:length])
        else:
            prompts.append(torch.randint(3, vocab, (length,), generator=g).tolist())
    return prompts


@pytest.fixture(scope="module")
def cases(target):
    """(prompt, reference continuation) pairs. A prompt whose reference path meets a near-tie (margin
    below MIN_MARGIN) is left out: there, fp32 rounding differences between batched and one-token
    forwards may legitimately pick another token. On the reference machine none is left out."""
    kept = []
    for prompt in make_prompts():
        reference, margin = full_recompute_greedy(target.model.hf, prompt, MAX_NEW)
        if margin >= MIN_MARGIN:
            kept.append((prompt, reference))
    assert len(kept) >= 12
    return kept


def perturbed_copy(hf, noise=0.2, seed=9):
    """The target with noise on its output layer: agrees with the target on most, not all, tokens."""
    noisy = copy.deepcopy(hf)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = noisy.lm_head.weight
        w.add_(torch.randn(w.shape, generator=g) * w.std() * noise)
    return noisy


@pytest.fixture(scope="module")
def drafters(target, draft):
    """Fresh drafters, each with its own model instance (and so its own KV cache)."""
    hf = target.model.hf
    return {
        "ngram": NgramDrafter(),
        "draft": DraftModelDrafter(draft.model, target.model.vocab_size),
        "self": DraftModelDrafter(FastLlama(hf), target.model.vocab_size),
        "noisy": DraftModelDrafter(FastLlama(perturbed_copy(hf)), target.model.vocab_size),
        # reads prompts longer than 4 + 5 tokens through their ends only (draft_lm.py's window)
        "windowed": DraftModelDrafter(FastLlama(perturbed_copy(hf)), target.model.vocab_size, window=5),
    }


# --- greedy identity --------------------------------------------------------------------------------


def test_plain_greedy_equals_full_recompute_and_is_deterministic(target, target_hf, cases):
    for prompt, reference in cases:
        out, steps = run(target.model, NoDrafter(), prompt, k=4)
        assert out == reference
        assert len(steps) == MAX_NEW and all(s.drafted == 0 and len(s.tokens) == 1 for s in steps)
        assert run(target.model, NoDrafter(), prompt, k=4)[0] == reference
    for prompt, reference in cases[:4]:  # HF forward with DynamicCache: the same tokens
        assert run(target_hf.model, NoDrafter(), prompt, k=1)[0] == reference


def test_batched_extend_matches_one_token_extends(target, target_hf):
    tokens = torch.tensor(make_prompts(count=1, seed=5)[0] * 2)
    with torch.inference_mode():
        full = target.model.hf(input_ids=tokens[None], use_cache=False).logits[0].float()
    for model in (target.model, target_hf.model):
        model.reset()
        batched = model.extend(tokens)
        model.reset()
        one_by_one = torch.cat([model.extend(tokens[i : i + 1]) for i in range(len(tokens))])
        model.reset()
        split = torch.cat([model.extend(tokens[:7]), model.extend(tokens[7:])])
        for logits in (batched, one_by_one, split):
            assert torch.allclose(logits, full, atol=1e-3, rtol=0)
            assert torch.equal(logits.argmax(-1), full.argmax(-1))
    # the fixture's logits are peaked: typical top-1/top-2 gap far above the numerical noise
    top = full.topk(2, dim=-1).values
    assert float((top[:, 0] - top[:, 1]).median()) > 0.2
    assert float(full.std()) > 2


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("name", ["ngram", "draft", "self", "noisy", "windowed"])
def test_greedy_speculation_is_token_identical_to_plain(target, drafters, cases, name, k):
    drafter = drafters[name]
    drafted = accepted = 0
    for prompt, reference in cases:
        out, steps = run(target.model, drafter, prompt, k=k)
        assert out == reference, (name, k, prompt)
        drafted += sum(s.drafted for s in steps)
        accepted += sum(s.accepted for s in steps)
    assert drafted > 0
    if name == "self":
        assert accepted == drafted  # draft = target: every draft token is accepted
    elif name == "noisy":
        assert 0.1 * drafted < accepted < drafted  # partial acceptance: rollback in both caches
    elif name == "ngram":
        assert accepted > 0


@pytest.mark.parametrize("name,k", [("ngram", 4), ("noisy", 1), ("noisy", 4), ("self", 8)])
def test_greedy_speculation_with_the_hf_backend(target, target_hf, cases, name, k):
    """HFModel (DynamicCache cropped on rollback) as target, and as the draft model too."""
    hf = target.model.hf
    drafter = {
        "ngram": NgramDrafter(),
        "noisy": DraftModelDrafter(HFModel(perturbed_copy(hf)), target.model.vocab_size),
        "self": DraftModelDrafter(HFModel(hf), target.model.vocab_size),
    }[name]
    for prompt, reference in cases[:5]:
        assert run(target_hf.model, drafter, prompt, k=k)[0] == reference


# --- draft = target ---------------------------------------------------------------------------------


def test_self_draft_accepts_everything_greedy_through_generate(target):
    drafter = DraftModelDrafter(FastLlama(target.model.hf), target.model.vocab_size)
    prompt = make_prompts(count=1, seed=3)[0]
    result = generate(target, drafter, prompt, k=4, max_new_tokens=26)
    stats = result.stats
    if result.finish_reason == "length":
        assert stats.new_tokens == 26 and stats.steps == 6  # 5 steps of 4 + 1, then 1 draft + 1
    assert stats.acceptance_rate == 1.0 and stats.accepted == stats.drafted > 0
    assert stats.acceptance_by_position == [1.0] * 4


def test_self_draft_sampling_accepts_everything(target, tables):
    # Table model: q and p are computed identically, so u * q(d) >= p(d) never holds: acceptance 1.
    table, _ = tables
    for params in (Warp(temperature=1.0), Warp(temperature=0.7, top_p=0.9, top_k=5)):
        drafter = DraftModelDrafter(TableModel(table.table), table.vocab_size)
        drafted = accepted = 0
        for seed in range(30):
            _, steps = run(table, drafter, [1, 2], k=4, params=params, max_new_tokens=12, seed=seed)
            drafted += sum(s.drafted for s in steps)
            accepted += sum(s.accepted for s in steps)
        assert accepted == drafted == 30 * 9  # steps draft 4, 4 and 1 (12 = 5 + 5 + 2)
    # Real model: p (batched verify forward) and q (one-token draft forwards) agree to ~1e-5, so a
    # rejection needs u within ~1e-5 of 1; allow for that rounding, nothing more.
    drafter = DraftModelDrafter(FastLlama(target.model.hf), target.model.vocab_size)
    drafted = accepted = 0
    for prompt in make_prompts(count=6, seed=4):
        _, steps = run(target.model, drafter, prompt, k=4, params=Warp(temperature=1.0), seed=len(prompt))
        drafted += sum(s.drafted for s in steps)
        accepted += sum(s.accepted for s in steps)
    assert drafted >= 60 and accepted >= drafted - 1


# --- bookkeeping ------------------------------------------------------------------------------------


def test_stats_bookkeeping_matches_the_steps(target, drafters, monkeypatch):
    monkeypatch.setattr(LoadedModel, "eos_ids", property(lambda self: set()))  # run to the length limit
    prompt = make_prompts(count=2, seed=7)[1]
    drafter = drafters["noisy"]
    _, steps = run(target.model, drafter, prompt, k=4, max_new_tokens=30)
    result = generate(target, drafter, prompt, k=4, max_new_tokens=30)
    stats = result.stats

    assert result.finish_reason == "length"
    assert result.token_ids == [t for s in steps for t in s.tokens]
    assert stats.new_tokens == len(result.token_ids) == 30
    assert stats.steps == len(steps) and stats.prefills == 1 and stats.target_forwards == len(steps) + 1
    assert stats.drafted == sum(s.drafted for s in steps)
    assert stats.accepted == sum(s.accepted for s in steps)
    assert 0 < stats.accepted < stats.drafted
    for s in steps:
        assert len(s.tokens) == s.accepted + 1 and s.accepted <= s.drafted <= 4
    assert [s.finished for s in steps] == [False] * (len(steps) - 1) + [True]
    assert stats.drafted_by_pos == [sum(s.drafted > i for s in steps) for i in range(4)]
    assert stats.accepted_by_pos == [sum(s.accepted > i for s in steps) for i in range(4)]
    assert sum(stats.drafted_by_pos) == stats.drafted and sum(stats.accepted_by_pos) == stats.accepted
    assert stats.acceptance_rate == stats.accepted / stats.drafted
    # τ: tokens per verify forward; without EOS every step commits accepted + 1
    assert stats.mean_accepted_length == pytest.approx(1 + stats.accepted / stats.steps)
    assert stats.mean_accepted_length == pytest.approx(stats.new_tokens / stats.steps)
    assert stats.wall_s >= stats.draft_s + stats.verify_s > 0


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_max_new_tokens_is_never_exceeded(target, k):
    drafter = DraftModelDrafter(FastLlama(target.model.hf), target.model.vocab_size)  # accepts all
    prompt = make_prompts(count=1, seed=11)[0]
    for max_new in (1, 2, 3, 5, 9):
        out, steps = run(target.model, drafter, prompt, k=k, max_new_tokens=max_new)
        assert len(out) == max_new
        assert len(steps) == -(-max_new // (k + 1))  # every step commits k + 1, the last one the rest
        committed = 0
        for s in steps:
            assert s.drafted == min(k, max_new - committed - 1)
            committed += len(s.tokens)


@pytest.mark.parametrize("name", ["none", "ngram", "self", "noisy"])
def test_eos_stops_and_drops_tokens_after_it(target, drafters, cases, name):
    drafter = NoDrafter() if name == "none" else drafters[name]
    truncated_in_step = 0
    for prompt, reference in cases[:6]:
        position = next(i for i in range(6, MAX_NEW) if reference[i] not in reference[:i])
        eos = reference[position]
        for k in (1, 4, 8):
            out, steps = run(target.model, drafter, prompt, k=k, eos_ids={eos, 999})
            assert out == reference[: position + 1]
            assert steps[-1].finished and not any(s.finished for s in steps[:-1])
            last = steps[-1]
            assert last.tokens[-1] == eos and len(last.tokens) <= last.accepted + 1
            truncated_in_step += len(last.tokens) < last.accepted + 1
    if name == "self":
        assert truncated_in_step > 0  # EOS among accepted drafts: the drafts after it were dropped


def test_generate_stops_at_the_models_eos(target, cases, monkeypatch):
    prompt, reference = cases[0]
    position = next(i for i in range(3, MAX_NEW) if reference[i] not in reference[:i])
    monkeypatch.setattr(LoadedModel, "eos_ids", property(lambda self: {reference[position]}))
    result = generate(target, NgramDrafter(), prompt, k=4, max_new_tokens=MAX_NEW)
    assert result.finish_reason == "stop"
    assert result.token_ids == reference[: position + 1] and result.stats.new_tokens == position + 1
    assert result.prompt_tokens == len(prompt)


def test_generate_text_stop_strings_and_streaming(target):
    base = generate(target, NoDrafter(), "the cat sat on the mat", k=1, max_new_tokens=24, chat=False)
    assert base.text == target.tokenizer.decode(base.token_ids, skip_special_tokens=True)
    cut = next(
        i
        for i in range(4, len(base.text))
        if base.text[i - 4 : i].strip() and base.text[i - 4 : i] not in base.text[: i - 1]
    )
    stop = base.text[cut - 4 : cut]
    pieces = []
    result = generate(
        target,
        NgramDrafter(),
        "the cat sat on the mat",
        k=4,
        max_new_tokens=24,
        chat=False,
        stop=[stop],
        on_text=pieces.append,
    )
    assert result.finish_reason == "stop"
    assert result.text == base.text[: base.text.find(stop)]
    assert "".join(pieces) == result.text
    assert result.token_ids == base.token_ids[: len(result.token_ids)]


def test_generate_rejects_bad_arguments(target):
    for kwargs, message in [
        ({"k": 0}, "k must be"),
        ({"k": 65}, "k must be"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 600}, "exceeds the model's context"),
    ]:
        with pytest.raises(UserError, match=message):
            generate(target, NoDrafter(), [5, 6, 7], **kwargs)
    with pytest.raises(UserError, match="empty prompt"):
        generate(target, NoDrafter(), "  ")


def test_target_cache_holds_every_committed_token_but_the_last(tables):
    target, draft_model = tables
    drafter = DraftModelDrafter(draft_model, target.vocab_size)
    for params in (GREEDY, Warp(temperature=1.0)):
        prompt = [1, 2, 3]
        context = list(prompt)
        g = torch.Generator().manual_seed(0)
        for step in decode(target, drafter, prompt, k=3, params=params, max_new_tokens=40, generator=g):
            context += step.tokens
            assert target.tokens == context[:-1]
            # the drafter's bookkeeping is right: its model holds the context it drafted from plus
            # all but the last of its drafts (the last one was never fed)
            assert draft_model.tokens == drafter.cached
            if step.drafted:
                before = len(context) - len(step.tokens)
                assert drafter.cached[:before] == context[:before]
                assert len(drafter.cached) == before + step.drafted - 1
        assert len(context) == len(prompt) + 40


# --- distribution through the real loop -------------------------------------------------------------
# Target and draft are TableModels on V = 8 (logits depend on the last token only), so the exact
# distribution of the first two new tokens is P(a, b) = p(a | last prompt token) * p(b | a) after
# warp. k = 2 and max_new_tokens = 3: the first step drafts two tokens, so acceptance, rejection at
# draft positions 1 and 2, the recovered token and the bonus token all feed the first two tokens.
N = 20_000


def ngram_prompt(table, params):
    """[x, b, c, x, b]: the n-gram drafter proposes [c, x] after it; c is b's most likely successor
    and x is c's, so those drafts are inside any top-k / top-p support and often accepted."""
    b = 2
    c = int(table[b].argmax())
    x = int(table[c].argmax())
    return [x, b, c, x, b]


def first_two_counts(target, drafter, prompt, params, n, seed=0):
    """Joint counts of the first two new tokens over n runs, drafted and accepted totals, and in how
    many runs the very first draft token was accepted."""
    vocab = target.vocab_size
    counts = [0] * (vocab * vocab)
    g = torch.Generator().manual_seed(seed)
    drafted = accepted = first_accepted = 0
    for _ in range(n):
        out = []
        for step in decode(target, drafter, prompt, k=2, params=params, max_new_tokens=3, generator=g):
            if not out:
                first_accepted += step.accepted > 0
            out += step.tokens
            drafted += step.drafted
            accepted += step.accepted
            if len(out) >= 2:  # the first two tokens are fixed: skip the rest of the run
                break
        counts[out[0] * vocab + out[1]] += 1
    return torch.tensor(counts).view(vocab, vocab), drafted, accepted, first_accepted


def first_two_counts_batched(target, drafter, prompt, params, n, seed=0, slots=8):
    """first_two_counts through the batched core: n sequences, `slots` decoding side by side (each
    with its own generator and drafter copy, as server requests), joining as others finish."""
    vocab = target.vocab_size
    counts = [0] * (vocab * vocab)
    core = BatchDecoder(PerSlotLM([TableModel(target.table) for _ in range(slots)]))
    running: dict[Sequence, list[int]] = {}
    drafted = accepted = first_accepted = started = 0
    while started < n or running:
        fresh = [
            Sequence(
                prompt,
                drafter.fork(),
                FixedK(2),
                params,
                torch.Generator().manual_seed(seed * n + started + i),
                3,
            )
            for i in range(min(len(core.free), n - started))
        ]
        started += len(fresh)
        core.start(fresh)
        running.update((seq, []) for seq in fresh)
        for seq, step in zip(list(running), core.step(list(running))):
            if not running[seq]:
                first_accepted += step.accepted > 0
            running[seq] += step.tokens
            drafted += step.drafted
            accepted += step.accepted
            if len(running[seq]) >= 2:  # the first two tokens are fixed: skip the rest of the run
                out = running.pop(seq)
                counts[out[0] * vocab + out[1]] += 1
                core.release(seq)
    return torch.tensor(counts).view(vocab, vocab), drafted, accepted, first_accepted


RUNNERS = {"decode": first_two_counts, "batched": first_two_counts_batched}


# Each setting costs ~20 s on a small CPU (the loop's per-step overhead), so the four features are
# covered by two settings: T 0.7 with top-k 3 through the draft-model drafter (q with probabilities),
# T 1.0 with top-p 0.9 through the n-gram drafter (one-hot q).
SETTINGS = [
    ("draft", Warp(temperature=0.7, top_k=3)),
    ("ngram", Warp(temperature=1.0, top_p=0.9)),
]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("drafter_name,params", SETTINGS, ids=[f"{d}-{p}" for d, p in SETTINGS])
def test_sampled_tokens_follow_the_target_distribution(tables, drafter_name, params, runner):
    target, draft_model = tables
    p = warp(target.table[2], params)  # the target's distribution for the first new token
    if drafter_name == "draft":
        drafter, prompt = DraftModelDrafter(draft_model, target.vocab_size), [2]
        q = warp(draft_model.table[2], params)
        first_acceptance = float(torch.minimum(p, q).sum())  # P(accept d ~ q) = Σ min(p, q)
    else:
        drafter, prompt = NgramDrafter(), ngram_prompt(target.table, params)
        first_acceptance = float(p[prompt[2]])  # one-hot q: P(accept d) = p(d)
    assert prompt[-1] == 2
    exact = joint_two(target.table, 2, params)
    counts, drafted, accepted, first_accepted = RUNNERS[runner](target, drafter, prompt, params, N)
    assert drafted >= 2 * N and 0.05 * drafted < accepted < 0.95 * drafted  # both paths exercised
    # The acceptance rate of the first draft token is known exactly (Leviathan et al. 2023, §3.3);
    # Hoeffding: P(|mean - α| >= t) <= 2 exp(-2 N t²) = delta -> t = sqrt(ln(2 / delta) / (2N)) = 0.019.
    # This catches a loop that samples with the wrong q (e.g. ignores the drafter's probabilities:
    # still exact in distribution, but it accepts less).
    assert abs(first_accepted / N - first_acceptance) < math.sqrt(math.log(2 / DELTA) / (2 * N))
    support = int((exact > 0).sum())
    assert counts[exact == 0].sum() == 0  # never a token outside the warped support
    # Weissman et al. 2003 with m = support size of the exact joint (see helpers.tv_bound);
    # e.g. 64 cells and 20k draws: 0.038.
    assert tv(counts, exact) < tv_bound(support, N)


def test_sampled_tokens_follow_the_target_distribution_when_draft_chains_stop_early(tables):
    """`draft:stop=P`: a chain keeps a token while its odds pay P (a sampled token judged on its
    expected probability, never on its own draw) and proposes one token in some steps and two in
    others; the output keeps the target's distribution."""
    target, draft_model = tables
    params = Warp(temperature=0.7, top_k=3)
    lengths = []

    class Recorded(DraftModelDrafter):
        def propose(self, *args):
            proposal = super().propose(*args)
            lengths.append(proposal.tokens.numel())
            return proposal

    drafter = Recorded(draft_model, target.vocab_size, stop=0.2)
    exact = joint_two(target.table, 2, params)
    counts, drafted, accepted, _ = first_two_counts(target, drafter, [2], params, N)
    assert {1, 2} <= set(lengths) and 0.05 * drafted < accepted < 0.95 * drafted
    assert counts[exact == 0].sum() == 0
    assert tv(counts, exact) < tv_bound(int((exact > 0).sum()), N)


@pytest.mark.parametrize("runner", RUNNERS)
def test_distribution_check_catches_a_wrong_residual(tables, monkeypatch, runner):
    """Negative control through the same loop: recovered tokens drawn from p instead of
    norm(max(0, p - q)) must fail the check (with 3k runs and the correspondingly wider bound)."""

    def residual_is_p(draft, q, p, generator):
        k = draft.shape[0]
        u = torch.rand(k, generator=generator)
        for i in range(k):
            q_i = q[i, draft[i]] if q is not None else 1.0
            if u[i] * q_i >= p[i, draft[i]]:
                return Verdict(i, int(torch.multinomial(p[i], 1, generator=generator)))
        return Verdict(k, int(torch.multinomial(p[k], 1, generator=generator)))

    monkeypatch.setattr(step_module, "verify_rejection", residual_is_p)
    target, draft_model = tables
    params = Warp(temperature=1.0)
    n = 3000  # bound 0.098 for 64 cells; this bug lands at TV ≈ 0.19
    counts, *_ = RUNNERS[runner](target, DraftModelDrafter(draft_model, 8), [2], params, n)
    assert tv(counts, joint_two(target.table, 2, params)) > tv_bound(64, n)


def test_stats_merge_of_generate_results(target):
    a = generate(target, NgramDrafter(), [7, 8, 9, 7, 8], k=2, max_new_tokens=8).stats
    b = generate(target, NgramDrafter(), [10, 11, 10, 11], k=2, max_new_tokens=8).stats
    merged = a.merge(b)
    assert isinstance(merged, Stats)
    assert merged.steps == a.steps + b.steps and merged.prefills == 2
    assert merged.new_tokens == a.new_tokens + b.new_tokens


def test_sampled_tree_verification_in_the_batched_core_follows_the_target(tables):
    """Token trees in the batched path (suffix and n-gram trees reach the server this way): an n-gram
    tree of two branches after `b`, sampled at T 1.0, gives the target's joint distribution."""
    target, _ = tables
    params = Warp(temperature=1.0)
    b = 2
    c1, c2 = (int(t) for t in target.table[b].topk(2).indices)
    prompt = [b, c1, int(target.table[c1].argmax()), b, c2, int(target.table[c2].argmax()), b]
    counts, drafted, accepted, _ = first_two_counts_batched(
        target, NgramDrafter(min_n=1, branches=2), prompt, params, N
    )
    assert drafted > 2 * N and 0.05 * drafted < accepted < 0.95 * drafted  # trees drafted, both paths taken
    exact = joint_two(target.table, b, params)
    assert counts[exact == 0].sum() == 0
    assert tv(counts, exact) < tv_bound(int((exact > 0).sum()), N)
