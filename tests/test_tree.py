"""Token trees: structure (depth, mask, positions, paths, trie merge, best nodes), and the models'
tree forward: one extend_tree gives every path's chain logits; keep() compacts the accepted path so
that later decoding equals a recomputation (FastLlama and the HF fallback)."""

import pytest
import torch

from conftest import make_llama
from specdecode.backends import models
from specdecode.backends.fast_llama import FastLlama
from specdecode.core.tree import Tree, best_nodes
from specdecode.errors import UserError

#        root
#       /    \
#      5      9
#     / \      \
#    6   8      10
#   / \          \
#  7   13         11
#                  \
#                   12
SEQUENCES = [[5, 6, 7], [5, 8], [9, 10, 11, 12], [5, 6, 13], [5, 6]]


@pytest.fixture
def tree():
    return Tree.from_sequences(SEQUENCES)


def test_trie_merges_shared_prefixes(tree):
    assert tree.tokens == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert tree.parents == [-1, 0, 1, 0, -1, 4, 5, 6, 1]
    assert tree.depth == [1, 2, 3, 2, 1, 2, 3, 4, 3]
    assert tree.max_depth == 4 and len(tree) == 9
    assert tree.children[0] == [0, 4] and tree.children[1 + 1] == [2, 8]  # root's; node 1's
    assert tree.child(-1, 9) == 4 and tree.child(1, 13) == 8 and tree.child(1, 5) is None
    # every candidate sequence is a path from the root; [5, 6] is a prefix, not a leaf
    assert [[tree.tokens[i] for i in p] for p in tree.paths()] == [
        [5, 6, 7],
        [5, 8],
        [9, 10, 11, 12],
        [5, 6, 13],
    ]
    assert tree.path_to(7) == [4, 5, 6, 7] and tree.path_to(-1) == []


def test_mask_is_the_ancestor_relation_in_the_plus_one_layout(tree):
    mask = tree.mask()
    assert mask.shape == (10, 10) and mask.dtype == torch.bool
    for i in range(len(tree)):
        visible = set(mask[i + 1].nonzero().flatten().tolist())
        assert visible == {0} | {j + 1 for j in tree.path_to(i)}  # root, ancestors and itself
    assert mask[0].tolist() == [True] + [False] * 9
    assert tree.positions(100).tolist() == [100, 101, 102, 103, 102, 101, 102, 103, 104, 103]


def test_a_chain_is_the_degenerate_tree():
    chain = Tree.chain([4, 3, 2])
    assert chain.parents == [-1, 0, 1] and chain.is_chain and chain.depth == [1, 2, 3]
    assert torch.equal(chain.mask(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert chain.paths() == [[0, 1, 2]]
    assert Tree.from_sequences([[4, 3, 2], [4, 3]]).is_chain
    assert not Tree.from_sequences([[4, 3], [4, 2]]).is_chain
    empty = Tree.chain([])
    assert len(empty) == 0 and empty.max_depth == 0 and empty.mask().shape == (1, 1)


def test_merge_keeps_earlier_trees_first(tree):
    other = Tree.from_sequences([[9, 10, 3], [2]])
    merged = Tree.merge([tree, other])
    assert merged.tokens[: len(tree)] == tree.tokens and merged.parents[: len(tree)] == tree.parents
    assert merged.tokens[len(tree) :] == [3, 2]  # 9 -> 10 was shared; 3 hangs under it
    assert merged.parents[len(tree) :] == [5, -1]
    assert Tree.merge([other, tree]).children[0] == [0, 3, 4]  # 9, 2, then 5


def test_subset_and_depth_limit(tree):
    shallow = tree.subset(tree.up_to_depth(2))
    assert shallow.tokens == [5, 6, 8, 9, 10] and shallow.parents == [-1, 0, 0, -1, 3]
    with pytest.raises(ValueError, match="ancestors"):
        tree.subset([0, 2])
    with pytest.raises(ValueError, match="parents must come before"):
        Tree([1, 2], [1, -1])
    with pytest.raises(ValueError, match="2 tokens but 1 parents"):
        Tree([1, 2], [-1])


def test_best_nodes_keeps_the_highest_scores_closed_under_ancestors():
    parents = [-1, -1, 0, 0, 1, 2]
    scores = [-0.1, -1.0, -0.3, -2.0, -1.2, -0.5]
    assert best_nodes(parents, scores, 3) == [0, 2, 5]
    assert best_nodes(parents, scores, 4) == [0, 1, 2, 5]
    assert best_nodes(parents, scores, 10) == list(range(6))
    # a child scored above its parent (possible with ties/rounding) brings the parent along
    assert best_nodes([-1, 0], [-1.0, -0.5], 2) == [0, 1]
    assert best_nodes([-1, 0, -1], [-1.0, -0.5, -0.7], 1) == [2]


# --- the models' tree forward -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    hf = make_llama(seed=3, layers=2, hidden=64)
    return hf, {"fast": lambda: FastLlama(hf), "hf": lambda: models.HFModel(hf)}


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_tree_logits_equal_each_paths_chain_logits(pair, tree, backend):
    hf, make = pair
    prompt = torch.arange(20, 57)
    model = make[backend]()
    model.extend(prompt[:-1])
    base = model.length
    logits = model.extend_tree(
        torch.tensor([int(prompt[-1])] + tree.tokens), tree.positions(base), tree.mask()
    )
    assert logits.shape == (len(tree) + 1, 384) and model.length == base + len(tree) + 1
    for path in tree.paths():
        chain = make[backend]()
        chain.extend(prompt[:-1])
        reference = chain.extend(torch.tensor([int(prompt[-1])] + [tree.tokens[i] for i in path]))
        assert torch.allclose(logits[[0] + [i + 1 for i in path]], reference, atol=1e-4, rtol=1e-4)
    # and the tree forward is not just the causal forward: a branch does not see its siblings
    model.truncate(base)
    causal = model.extend(torch.tensor([int(prompt[-1])] + tree.tokens))
    assert not torch.allclose(causal[5], logits[5], atol=1e-2)


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("path_index", [0, 2, 3])
def test_keep_compacts_the_accepted_path(pair, tree, backend, path_index):
    hf, make = pair
    prompt = torch.arange(100, 131)
    model = make[backend]()
    model.extend(prompt[:-1])
    base = model.length
    model.extend_tree(torch.tensor([int(prompt[-1])] + tree.tokens), tree.positions(base), tree.mask())
    path = tree.paths()[path_index]
    model.keep(base + 1, [base + 1 + i for i in path])
    assert model.length == base + 1 + len(path)
    after = model.extend(torch.tensor([7, 8, 9]))
    fresh = make[backend]()
    accepted = [tree.tokens[i] for i in path]
    reference = fresh.extend(torch.cat([prompt, torch.tensor(accepted + [7, 8, 9])]))[-3:]
    assert torch.allclose(after, reference, atol=1e-4, rtol=1e-4)


def test_extend_tree_mask_may_cover_earlier_cached_tree_nodes(pair):
    """The draft tree feeds a tree depth by depth: later nodes see earlier fed nodes only through the
    mask (tree_mask [n, t] covers the last t - n cached tokens too)."""
    hf, make = pair
    model = make["fast"]()
    model.extend(torch.arange(30, 50))
    base = model.length  # nodes 5 and 9 at position base, then their children 6 and 10
    model.extend_tree(torch.tensor([5, 9]), torch.tensor([base, base]), torch.eye(2, dtype=torch.bool))
    mask = torch.tensor([[True, False, True, False], [False, True, False, True]])
    second = model.extend_tree(torch.tensor([6, 10]), torch.tensor([base + 1, base + 1]), mask)
    for first, child, row in ((5, 6, 0), (9, 10, 1)):
        chain = make["fast"]()
        chain.extend(torch.arange(30, 50))
        assert torch.allclose(second[row], chain.extend(torch.tensor([first, child]))[-1], atol=1e-4)


def test_hf_trees_refuse_caches_they_cannot_compact():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    model = models.HFModel(MistralForCausalLM(cfg).eval())
    model.extend(torch.arange(10))
    with pytest.raises(UserError, match="token trees need plain full-attention KV caches"):
        model.extend_tree(
            torch.tensor([1, 2]), torch.tensor([10, 11]), torch.ones(2, 2, dtype=torch.bool).tril()
        )
