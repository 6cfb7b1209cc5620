import torch

from specdecode.sampling import SamplingParams, warp
from specdecode.verify import Verdict, verify_greedy, verify_rejection
from stats_util import tv, tv_bound


def one_hot_rows(choices, vocab=6):
    return torch.nn.functional.one_hot(torch.tensor(choices), vocab).float() * 5


def test_greedy_all_accepted_gives_bonus():
    logits = one_hot_rows([3, 1, 4, 2])  # target argmax after each prefix
    assert verify_greedy(torch.tensor([3, 1, 4]), logits) == Verdict(3, 2)


def test_greedy_first_and_middle_rejection():
    logits = one_hot_rows([3, 1, 4, 2])
    assert verify_greedy(torch.tensor([0, 1, 4]), logits) == Verdict(0, 3)
    assert verify_greedy(torch.tensor([3, 1, 5]), logits) == Verdict(2, 4)
    assert verify_greedy(torch.empty(0, dtype=torch.long), logits[:1]) == Verdict(0, 3)


def test_rejection_accepts_everything_when_q_equals_p():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 8, generator=g), -1)
    for _ in range(200):
        draft = torch.multinomial(p[:3], 1, generator=g)[:, 0]
        assert verify_rejection(draft, p[:3], p, g).accepted == 3


def test_rejection_never_accepts_impossible_token_one_hot():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 8, generator=g), -1)
    p[0, 5] = 0
    p[0] /= p[0].sum()
    for _ in range(300):
        v = verify_rejection(torch.tensor([5]), None, p, g)
        assert v.accepted == 0 and v.next_token != 5


def _first_token_counts(verifier, p, q, samples, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, vocab = q.shape
    counts = torch.zeros(vocab)
    drafts = torch.stack([torch.multinomial(q[i], samples, replacement=True, generator=g) for i in range(k)], 1)
    for draft in drafts:
        v = verifier(draft, q, p, g)
        counts[draft[0] if v.accepted > 0 else v.next_token] += 1
    return counts


def _random_pq(seed, vocab=8, k=3, params=SamplingParams(temperature=1.0)):
    g = torch.Generator().manual_seed(seed)
    p = warp(torch.randn(k + 1, vocab, generator=g) * 1.5, params)
    q = warp(torch.randn(k, vocab, generator=g) * 1.5, params)
    return p, q


SAMPLES = 20_000


def test_rejection_sampling_first_token_matches_target():
    for seed, params in enumerate([SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5)]):
        p, q = _random_pq(seed, params=params)
        counts = _first_token_counts(verify_rejection, p, q, SAMPLES)
        assert tv(counts, p[0]) < tv_bound(8, SAMPLES), (tv(counts, p[0]), params)


def test_rejection_sampling_one_hot_drafter_matches_target():
    p, q = _random_pq(3)
    one_hot = lambda d, q_, p_, g: verify_rejection(d, None, p_, g)  # noqa: E731
    counts = _first_token_counts(one_hot, p, q, SAMPLES)
    assert tv(counts, p[0]) < tv_bound(8, SAMPLES)


def test_negative_controls_exceed_the_bound():
    """Two plausible bugs must fail the same check, or the check proves nothing."""
    p, q = _random_pq(5)

    def always_accept(d, q_, p_, g):
        return Verdict(d.shape[0], int(torch.multinomial(p_[-1], 1, generator=g)))

    def residual_is_p(d, q_, p_, g):  # resample from p instead of norm(max(0, p - q)) on rejection
        v = verify_rejection(d, q_, p_, g)
        if v.accepted == 0:
            return Verdict(0, int(torch.multinomial(p_[0], 1, generator=g)))
        return v

    bound = tv_bound(8, SAMPLES)
    for bug in (always_accept, residual_is_p):
        counts = _first_token_counts(bug, p, q, SAMPLES)
        assert tv(counts, p[0]) > 2 * bound, bug.__name__
