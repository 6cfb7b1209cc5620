"""Tree verification: greedy walks the target's argmax; multi-draft rejection sampling commits tokens
distributed exactly as the target's, checked on the pure function and through the real loop."""

from dataclasses import replace

import pytest
import torch

from helpers import TableModel, joint_two, tv, tv_bound
from specdecode.core.sampling import Warp
from specdecode.core.tree import Tree
from specdecode.core.tree_verify import TreeVerdict, verify_tree_greedy, verify_tree_rejection
from specdecode.decoding import step as step_module
from specdecode.decoding.decoder import decode
from specdecode.drafters import DraftTreeDrafter, NgramDrafter

V = 8
TREE = Tree.from_sequences([[3, 1, 4], [3, 5], [2, 6]])  # nodes: 3 1 4 5 2 6


def logits_with_argmax(argmaxes):
    """[len(argmaxes), V] logits, row i peaked at argmaxes[i]."""
    g = torch.Generator().manual_seed(len(argmaxes))
    logits = torch.randn(len(argmaxes), V, generator=g)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 10.0
    return logits


# rows (+1 layout): root, after 3, after 1, after 4, after 5, after 2, after 6
@pytest.mark.parametrize(
    "argmaxes,expected",
    [
        ([3, 1, 4, 7, 0, 0, 0], TreeVerdict([0, 1, 2], 7)),  # first branch to its leaf + bonus
        ([3, 5, 0, 0, 7, 0, 0], TreeVerdict([0, 3], 7)),  # second child of node 3, bonus after the leaf
        ([2, 0, 0, 0, 0, 6, 1], TreeVerdict([4, 5], 1)),  # the root's second child
        ([3, 7, 0, 0, 0, 0, 0], TreeVerdict([0], 7)),  # node 3 accepted, none of its children
        ([6, 1, 4, 0, 0, 6, 0], TreeVerdict([], 6)),  # 6 is in the tree, but not a child of the root
    ],
)
def test_greedy_follows_the_targets_argmax(argmaxes, expected):
    verdict = verify_tree_greedy(TREE, logits_with_argmax(argmaxes))
    assert verdict == expected and verdict.accepted == len(expected.path)


# --- statistics of the pure verifier ----------------------------------------------------------------
# One level: siblings tried in order at the root; the committed first token must follow p0. (Siblings
# sampled without replacement, with q, are checked through the loop below: the draft-tree setting.)
N = 20_000  # draws through the loop
N_PURE = 10_000


def first_tokens(verifier, p, tree, q, n, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, dtype=torch.long)
    for _ in range(n):
        verdict = verifier(tree, q, p, g)
        first = tree.tokens[verdict.path[0]] if verdict.path else verdict.next_token
        counts[first] += 1
    return counts


def peaked(seed, rows=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * 1.5).softmax(-1)


def test_deterministic_siblings_commit_tokens_distributed_as_p():
    p = peaked(20, rows=4)  # root + 3 leaves
    top = p[0].argsort(descending=True).tolist()
    tree = Tree(top[:3], [-1, -1, -1])  # the three most likely tokens: acceptance carries most mass
    counts = first_tokens(verify_tree_rejection, p, tree, None, N_PURE, seed=0)
    assert tv(counts, p[0]) < tv_bound(V, N_PURE)


def no_residual_update(tree, q, p, generator):
    """Negative control: every sibling is tested against the unchanged p (no residual between
    siblings), and the recovered token is drawn from p."""
    node, path = -1, []
    while True:
        for child in tree.children[node + 1]:
            if float(torch.rand((), generator=generator)) < float(p[node + 1, tree.tokens[child]]):
                path.append(child)
                node = child
                break
        else:
            return TreeVerdict(path, int(torch.multinomial(p[node + 1], 1, generator=generator)))


def test_the_pure_check_catches_a_missing_residual():
    p = peaked(20, rows=4)
    tree = Tree(p[0].argsort(descending=True).tolist()[:3], [-1, -1, -1])
    n = 3000
    counts = first_tokens(no_residual_update, p, tree, None, n, seed=0)
    assert tv(counts, p[0]) > tv_bound(V, n)


# --- distribution through the real loop -------------------------------------------------------------
# As in test_decoder: TableModels on V = 8, exact joint P(first, second) = p(a | 2) p(b | a). k = 2, so
# the first step's tree decides both tokens (accepted nodes, recovered or bonus token).


def first_two_counts(target, drafter, prompt, params, n, seed=0):
    counts = torch.zeros(V * V, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    nodes = accepted = trees = 0
    for _ in range(n):
        out = []
        for step in decode(target, drafter, prompt, k=2, params=params, max_new_tokens=3, generator=g):
            if not out:
                trees += step.depth == 2 and step.drafted > 2
                nodes += step.drafted
                accepted += step.accepted
            out += step.tokens
            if len(out) >= 2:
                break
        counts[out[0] * V + out[1]] += 1
    return counts.view(V, V), nodes, accepted, trees


def ngram_tree_prompt(table):
    """[2, c1, d1, 2, c2, d2, 2]: ngram:1-1:b=2 proposes the tree {c2 -> d2, c1 -> d1} after it, where
    c1, c2 are the two most likely successors of 2 and d_i the most likely successor of c_i."""
    c1, c2 = table[2].topk(2).indices.tolist()
    d1, d2 = int(table[c1].argmax()), int(table[c2].argmax())
    assert 2 not in (c1, c2, d1, d2)
    return [2, c1, d1, 2, c2, d2, 2]


SETTINGS = [
    ("ngram-tree", Warp(temperature=1.0, top_p=0.9)),  # deterministic siblings, one-hot q
    ("draft-tree", Warp(temperature=0.8, top_k=4)),  # siblings sampled without replacement
]


@pytest.mark.parametrize("name,params", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_sampled_trees_follow_the_target_distribution(tables, name, params):
    target, draft_model = tables
    if name == "ngram-tree":
        drafter, prompt = NgramDrafter(max_n=1, min_n=1, branches=2), ngram_tree_prompt(target.table)
    else:
        drafter, prompt = DraftTreeDrafter(draft_model, V, branches=2), [2]
    exact = joint_two(target.table, 2, params)
    counts, nodes, accepted, trees = first_two_counts(target, drafter, prompt, params, N)
    assert trees == N and nodes == 4 * N  # every first step verified a 4-node tree (2 branches x 2)
    assert 0.2 * N < accepted < 1.8 * N  # acceptance and rejection both exercised
    assert counts[exact == 0].sum() == 0  # never a token outside the warped support
    assert tv(counts, exact) < tv_bound(int((exact > 0).sum()), N)


def test_distribution_check_catches_a_wrong_tree_verifier(tables, monkeypatch):
    """Negative control through the same loop: siblings tested without the residual update."""
    monkeypatch.setattr(step_module, "verify_tree_rejection", no_residual_update)
    target, _ = tables
    params = Warp(temperature=1.0)
    n = 3000
    drafter, prompt = NgramDrafter(max_n=1, min_n=1, branches=2), ngram_tree_prompt(target.table)
    counts, *_ = first_two_counts(target, drafter, prompt, params, n)
    assert tv(counts, joint_two(target.table, 2, params)) > tv_bound(64, n)


def test_distribution_check_catches_siblings_without_the_renormalised_q(tables, monkeypatch):
    """Negative control for the draft-tree rule: siblings drawn without replacement must each carry q
    with the earlier siblings removed and renormalised; reporting the plain q for every root sibling
    (what a drafter forgetting the rule would do) biases the committed tokens, and the check sees it."""
    target, draft_model = tables
    drafter = DraftTreeDrafter(draft_model, V, branches=2)
    real = drafter.propose

    def plain_q(context, k, params, generator):
        proposal = real(context, k, params, generator)
        probs, first = proposal.probs.clone(), proposal.tree().children[0]
        probs[first[1:]] = probs[first[0]].clone()  # sibling 0's row is q itself
        return replace(proposal, probs=probs)

    monkeypatch.setattr(drafter, "propose", plain_q)
    params = Warp(temperature=0.8, top_k=4)
    counts, *_ = first_two_counts(target, drafter, [2], params, N)
    exact = joint_two(target.table, 2, params)
    assert tv(counts, exact) > tv_bound(int((exact > 0).sum()), N)


def test_self_draft_tree_sampling_accepts_the_whole_depth(tables):
    """Draft = target, siblings sampled from q = p: the first sibling is always accepted (u·q < p)."""
    table, _ = tables
    drafter = DraftTreeDrafter(TableModel(table.table), V, branches=3)
    params = Warp(temperature=1.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        steps = list(decode(table, drafter, [1, 2], k=3, params=params, max_new_tokens=12, generator=g))
        assert all(s.accepted == s.depth > 0 for s in steps[:-1])
