"""verify_greedy and verify_rejection as pure functions, including the statistical guarantee that
rejection sampling commits tokens distributed exactly as the target's p."""

import pytest
import torch

from helpers import tv, tv_bound
from specdecode.core.verify import Verdict, verify_greedy, verify_rejection

V = 8


def logits_with_argmax(argmaxes, vocab=V):
    """[len(argmaxes), vocab] logits whose row i has its maximum (by a wide margin) at argmaxes[i]."""
    g = torch.Generator().manual_seed(len(argmaxes))
    logits = torch.randn(len(argmaxes), vocab, generator=g)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 10.0
    return logits


@pytest.mark.parametrize(
    "draft,argmaxes,expected",
    [
        ([3, 1, 4], [3, 1, 4, 2], Verdict(3, 2)),  # all accepted + bonus from the last row
        ([3, 1, 4], [5, 1, 4, 2], Verdict(0, 5)),  # first rejected: the target's choice replaces it
        ([3, 1, 4], [3, 7, 4, 2], Verdict(1, 7)),  # middle rejected: later matches do not count
        ([3, 1, 4], [3, 1, 6, 2], Verdict(2, 6)),  # last rejected
        ([], [6], Verdict(0, 6)),  # no drafts: plain greedy step
    ],
)
def test_verify_greedy(draft, argmaxes, expected):
    verdict = verify_greedy(list(draft), logits_with_argmax(argmaxes))
    assert verdict == expected
    assert isinstance(verdict.next_token, int) and isinstance(verdict.accepted, int)


def random_rows(rows, seed, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * scale).softmax(-1)


def test_rejection_accepts_everything_when_q_equals_p():
    k = 4
    p = random_rows(k + 1, seed=0)
    g = torch.Generator().manual_seed(1)
    for _ in range(500):
        draft = torch.stack([torch.multinomial(p[i], 1, generator=g)[0] for i in range(k)])
        verdict = verify_rejection(draft, p[:k].clone(), p, g)
        assert verdict.accepted == k


def test_rejection_never_accepts_a_token_the_target_excludes():
    k = 3
    p = random_rows(k + 1, seed=3)
    d = 5
    p[0, d] = 0.0
    p[0] /= p[0].sum()
    q = random_rows(k, seed=4)
    g = torch.Generator().manual_seed(0)
    residual_support = set(((p[0] - q[0]) > 0).nonzero().flatten().tolist())
    seen_one_hot, seen_q = set(), set()
    for _ in range(400):
        draft = torch.tensor([d, 1, 2])
        one_hot = verify_rejection(draft, None, p, g)  # q = one-hot at the draft token
        assert one_hot.accepted == 0 and one_hot.next_token != d
        seen_one_hot.add(one_hot.next_token)
        with_q = verify_rejection(draft, q, p, g)
        assert with_q.accepted == 0
        # the recovered token comes from norm(max(0, p - q)): only where p exceeds q
        assert with_q.next_token in residual_support
        seen_q.add(with_q.next_token)
    assert seen_one_hot == set(range(V)) - {d}  # one-hot residual: p without d, nothing else removed
    assert seen_q == residual_support


def test_rejection_one_hot_draft_of_a_certain_token_is_accepted():
    p = torch.zeros(3, V)
    p[0, 2] = 1.0
    p[1, 6] = 1.0
    p[2] = 1 / V
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        assert verify_rejection(torch.tensor([2, 6]), None, p, g).accepted == 2
        assert verify_rejection(torch.tensor([2, 5]), None, p, g) == Verdict(1, 6)


def test_rejection_is_reproducible_with_the_same_seed():
    p, q = random_rows(4, seed=5), random_rows(3, seed=6)
    draft = torch.tensor([1, 2, 3])
    a = [verify_rejection(draft, q, p, torch.Generator().manual_seed(s)) for s in range(30)]
    b = [verify_rejection(draft, q, p, torch.Generator().manual_seed(s)) for s in range(30)]
    assert a == b and len(set(a)) > 1


# --- statistics -------------------------------------------------------------------------------------
# Fixed random p (k+1 rows) and q (k rows) on V = 8, chosen so that both paths carry probability:
# P(accept draft 1) = Σ min(p0, q0) ≈ 0.68 (one-hot q: Σ q0·p0 ≈ 0.36), and TV(p0, q0) ≈ 0.32, so the
# recovered-token path matters and the negative controls below deviate from p0 by 0.19 and 0.32.
K = 3
P = random_rows(K + 1, seed=16)
Q = random_rows(K, seed=17)
N = 20_000


def committed_counts(verifier, n, seed, one_hot=False):
    """Counts of the first committed token, and of the second one given the first draft was accepted.
    Draft token i is drawn from q_i (for the one-hot case too: any draft choice must work there)."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(Q[i], n, replacement=True, generator=g) for i in range(K)], 1)
    first, second = [0] * V, [0] * V
    q = None if one_hot else Q
    for draft, listed in zip(drafts, drafts.tolist()):
        verdict = verifier(draft, q, P, g)
        committed = listed[: verdict.accepted] + [verdict.next_token]
        first[committed[0]] += 1
        if verdict.accepted >= 1:
            second[committed[1]] += 1
    return torch.tensor(first), torch.tensor(second)


@pytest.mark.parametrize("one_hot", [False, True], ids=["q", "one-hot"])
def test_rejection_sampling_commits_tokens_distributed_as_p(one_hot):
    first, second = committed_counts(verify_rejection, N, seed=0, one_hot=one_hot)
    # Weissman et al. 2003 bound with m = V outcomes and delta = 1e-6 (see helpers.tv_bound): 0.022 here
    assert tv(first, P[0]) < tv_bound(V, N)
    # Given that draft 1 was accepted, the next committed token (accepted draft 2 or the recovered
    # token) must follow p_1: here p_1 does not depend on draft 1, so this is its marginal.
    n2 = int(second.sum())
    assert n2 > 5000
    assert tv(second, P[1]) < tv_bound(V, n2)


def accept_all(draft, q, p, generator):
    """Negative control: skips the test min(1, p/q) (commits q's samples)."""
    return Verdict(draft.shape[0], int(torch.multinomial(p[-1], 1, generator=generator)))


def residual_is_p(draft, q, p, generator):
    """Negative control: the right acceptance test, but the recovered token is drawn from p instead of
    norm(max(0, p - q)), so tokens that q over-proposes are committed too often."""
    k = draft.shape[0]
    u = torch.rand(k, generator=generator)
    for i in range(k):
        if u[i] * q[i, draft[i]] >= p[i, draft[i]]:
            return Verdict(i, int(torch.multinomial(p[i], 1, generator=generator)))
    return Verdict(k, int(torch.multinomial(p[k], 1, generator=generator)))


@pytest.mark.parametrize("wrong", [accept_all, residual_is_p], ids=lambda f: f.__name__)
def test_the_statistical_test_catches_wrong_verifiers(wrong):
    # Exact TV of these verifiers from p0: accept_all -> TV(q0, p0); residual_is_p ->
    # ½ Σ |min(p0,q0) + (1 - Σ min(p0,q0)) p0 - p0|. Both must be far above the bound for the control
    # to mean something.
    m = torch.minimum(P[0], Q[0]).double()
    exact = {accept_all: Q[0].double(), residual_is_p: m + (1 - m.sum()) * P[0].double()}[wrong]
    n = 5000  # fewer draws, hence a wider bound (0.044): the bugs still exceed it several times over
    assert tv(exact, P[0]) > 3 * tv_bound(V, n)
    first, _ = committed_counts(wrong, n, seed=1)
    assert tv(first, P[0]) > tv_bound(V, n)
