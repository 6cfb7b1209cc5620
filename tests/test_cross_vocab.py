"""Cross-vocabulary drafting (drafters/cross_vocab.py) on tiny models with two tokenizer families:
greedy output equals the target's own (SLEM), sampled output follows the target's distribution (TLI),
and check-tokenizers reports overlap and probe agreement."""

from __future__ import annotations

import pytest
import torch

from conftest import make_sentencepiece_tokenizer, make_tokenizer
from helpers import ScriptModel, TableModel, tv, tv_bound
from specdecode import drafters
from specdecode.backends.precision import FP32
from specdecode.backends.tokenizer_check import compare, token_bytes
from specdecode.core.sampling import Warp, warp
from specdecode.decoding.decoder import decode
from specdecode.decoding.generation import generate
from specdecode.drafters import CrossVocabDrafter, DrafterContext
from specdecode.drafters.cross_vocab import intersection
from specdecode.errors import UserError

PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):\n    return",
    "Hello, world! How are",
    "SELECT id, name FROM",
]


@pytest.fixture(scope="module")
def sp_target(sentencepiece_draft_dir):
    """The SentencePiece-style model as a target (the byte-level tiny draft then drafts for it)."""
    from specdecode.backends import models

    return models.load(sentencepiece_draft_dir, FP32, "cpu")


def test_byte_level_and_sentencepiece_token_texts():
    byte_level, sp = make_tokenizer(), make_sentencepiece_tokenizer()
    for tok in (byte_level, sp):
        texts = token_bytes(tok)
        assert tok.eos_token_id not in texts and tok.convert_tokens_to_ids("<|user|>") not in texts
        for text in (" the", " quick", "fibonacci", "\n"):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert b"".join(texts[i] for i in ids) == text.encode()  # pieces map back to the text's bytes
    assert any(piece.startswith("Ġ") for piece in byte_level.get_vocab())
    assert any(piece.startswith("▁") for piece in sp.get_vocab())


def test_intersection_maps_equal_texts_and_eos():
    draft_tok, target_tok = make_sentencepiece_tokenizer(), make_tokenizer()
    eos = {draft_tok.eos_token_id}
    to_target = intersection(draft_tok, target_tok, len(draft_tok), eos, target_tok.eos_token_id)
    d_text, t_text = token_bytes(draft_tok), token_bytes(target_tok)
    mapped = (to_target >= 0).nonzero().flatten().tolist()
    assert 50 < len(mapped) < len(draft_tok)
    for i in mapped:
        if i in eos:
            assert int(to_target[i]) == target_tok.eos_token_id
        else:
            assert d_text[i] == t_text[int(to_target[i])]
    unmapped = set(range(len(draft_tok))) - set(mapped)
    assert all(d_text.get(i) not in set(t_text.values()) for i in unmapped)


def test_check_tokenizers_reports_overlap_and_probes():
    a, b = make_tokenizer(), make_sentencepiece_tokenizer()
    report = compare(a, b)
    assert not report.compatible
    set_a, set_b = set(token_bytes(a).values()), set(token_bytes(b).values())
    assert report.overlap_a == pytest.approx(
        sum(t in set_b for t in token_bytes(a).values()) / len(token_bytes(a))
    )
    assert report.overlap_b == pytest.approx(
        sum(t in set_a for t in token_bytes(b).values()) / len(token_bytes(b))
    )
    assert (
        0 < report.overlap_a < report.overlap_b < 1
    )  # the small character-level vocabulary is mostly inside
    assert 0 < report.boundary_agreement < 1 and 0 < report.round_trips <= 1
    summary = report.summary("bytes", "sp")
    assert "of bytes's tokens exist in sp" in summary and "token boundaries agree" in summary
    assert "cross-vocabulary drafting: supported" in summary
    same = compare(a, make_tokenizer())
    assert same.compatible and same.overlap_a == same.overlap_b == 1.0 and "overlap" not in same.summary()


@pytest.mark.parametrize("direction", ["sp-drafts-bytes", "bytes-draft-sp", "other-bytes-drafts-bytes"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_equals_plain(
    direction, k, target, sp_target, tiny_draft_dir, sentencepiece_draft_dir, other_tokenizer_dir
):
    tgt, draft_dir = {
        "sp-drafts-bytes": (target, sentencepiece_draft_dir),
        "bytes-draft-sp": (sp_target, tiny_draft_dir),
        "other-bytes-drafts-bytes": (target, other_tokenizer_dir),
    }[direction]
    ctx = DrafterContext(tgt, device="cpu")
    drafter = drafters.build(f"draft:{draft_dir}", ctx)
    assert isinstance(drafter, CrossVocabDrafter)
    plain = drafters.build("none", ctx)
    drafted = 0
    for prompt in PROMPTS:
        want = generate(tgt, plain, prompt, max_new_tokens=24, chat=False)
        got = generate(tgt, drafter, prompt, k=k, max_new_tokens=24, chat=False)
        assert got.token_ids == want.token_ids, prompt
        assert got.stats.drafted <= k * got.stats.steps
        drafted += got.stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("draft_family", ["sentencepiece", "same"])
def test_a_draft_that_writes_the_targets_text_is_mostly_accepted(draft_family):
    """Target and draft each spell the same text in their own tokens (ScriptModel). SLEM re-encodes the
    draft's text into target tokens, so nearly everything is accepted; what is not comes from
    text boundaries where the draft's tokens of a prefix differ from its tokens of the whole text."""
    target_tok = make_tokenizer()
    draft_tok = make_sentencepiece_tokenizer() if draft_family == "sentencepiece" else make_tokenizer()
    prompt_text, script = "The quick brown fox", " jumps over the lazy dog. Hello, world! How are you today?"
    prompt = target_tok(prompt_text)["input_ids"]
    target_script = target_tok(script, add_special_tokens=False)["input_ids"]
    draft_prompt = draft_tok(target_tok.decode(prompt))["input_ids"]
    draft = ScriptModel(
        len(draft_tok), len(draft_prompt), draft_tok(script, add_special_tokens=False)["input_ids"]
    )
    target = ScriptModel(len(target_tok), len(prompt), target_script)
    drafter = CrossVocabDrafter(
        draft, draft_tok, target_tok, len(target_tok), {draft_tok.eos_token_id}, target_tok.eos_token_id
    )
    steps = list(
        decode(
            target,
            drafter,
            prompt,
            k=4,
            params=Warp(),
            max_new_tokens=len(target_script) + 1,
            eos_ids={target_tok.eos_token_id},
        )
    )
    assert [t for s in steps for t in s.tokens] == target_script + [target_tok.eos_token_id]
    accepted, drafted = sum(s.accepted for s in steps), sum(s.drafted for s in steps)
    assert accepted / drafted > (0.95 if draft_family == "same" else 0.7), (accepted, drafted)
    assert len(steps) < len(target_script) / 2


@pytest.mark.parametrize("option", ["b=2", "window=8"])
def test_draft_options_need_the_same_tokenizer(target, sentencepiece_draft_dir, option):
    key = option.split("=")[0]
    with pytest.raises(UserError, match=rf"its options \({key}\) need the same one"):
        drafters.build(f"draft:{option}:{sentencepiece_draft_dir}", DrafterContext(target, device="cpu"))


# --- sampling (TLI): statistical losslessness through the real loop, on table models -----------------

N = 6_000


def tli_tables(target_tok, draft_tok, seed=0):
    """A random target table over the byte-level vocabulary and a draft table over the SentencePiece one
    that, on the shared tokens, copies the target's logits (plus noise): q resembles p without being
    p, so both acceptance and rejection happen."""
    g = torch.Generator().manual_seed(seed)
    vt, vd = len(target_tok), len(draft_tok)
    to_target = intersection(draft_tok, target_tok, vd, {draft_tok.eos_token_id}, target_tok.eos_token_id)
    target = torch.randn(vt, vt, generator=g) * 2
    target[:, to_target[to_target >= 0]] += 2  # shared tokens are likelier, as in text both models know
    rows = torch.where(to_target >= 0, to_target, 0)
    draft = target[rows][:, rows] + torch.randn(vd, vd, generator=g) * 0.7
    draft[:, to_target < 0] -= 4
    return TableModel(target), TableModel(draft)


def test_tli_sampling_follows_the_target_distribution():
    target_tok, draft_tok = make_tokenizer(), make_sentencepiece_tokenizer()
    target, draft = tli_tables(target_tok, draft_tok)
    params = Warp(temperature=0.8, top_k=3)
    drafter = CrossVocabDrafter(
        draft, draft_tok, target_tok, target.vocab_size, {draft_tok.eos_token_id}, target_tok.eos_token_id
    )
    prompt = target_tok("The cat sat on the", add_special_tokens=False)["input_ids"]
    last = prompt[-1]  # ' the' is a token of both: the draft's table row for it copies the target's
    assert int(drafter.to_target[draft_tok(" the", add_special_tokens=False)["input_ids"][-1]]) == last
    p1 = warp(target.table[last], params).double()
    exact = p1[:, None] * warp(target.table, params).double()  # [V, V]: P(first, second)
    counts = torch.zeros_like(exact)
    g = torch.Generator().manual_seed(0)
    drafted = accepted = 0
    for _ in range(N):
        out = []
        for step in decode(target, drafter, prompt, k=2, params=params, max_new_tokens=3, generator=g):
            out += step.tokens
            drafted, accepted = drafted + step.drafted, accepted + step.accepted
            if len(out) >= 2:
                break
        counts[out[0], out[1]] += 1
    assert 0.1 * drafted < accepted < 0.9 * drafted  # acceptance and rejection both exercised
    assert counts[exact == 0].sum() == 0
    # Weissman et al. 2003 (helpers.tv_bound) with m = the exact joint's support (<= 9 cells here)
    assert tv(counts, exact) < tv_bound(int((exact > 0).sum()), N)
