"""tokenizer_check.compare: same tokenizer -> compatible; any difference -> reported, not compatible."""

import pytest
from transformers import AutoTokenizer

from conftest import make_tokenizer
from specdecode.backends.tokenizer_check import PROBES, compare


@pytest.fixture(scope="module")
def saved_tokenizers(tiny_model_dir, tiny_draft_dir, other_tokenizer_dir):
    return {
        name: AutoTokenizer.from_pretrained(path)
        for name, path in (
            ("target", tiny_model_dir),
            ("draft", tiny_draft_dir),
            ("other", other_tokenizer_dir),
        )
    }


def test_same_tokenizer_is_compatible(saved_tokenizers, tiny_tokenizer):
    for a, b in (
        (saved_tokenizers["target"], saved_tokenizers["draft"]),
        (tiny_tokenizer, saved_tokenizers["draft"]),
    ):
        report = compare(a, b)
        assert report.compatible
        assert report.vocab_size_a == report.vocab_size_b == report.shared_tokens == 384
        assert report.differing == report.special_differences == report.probe_mismatches == []
        summary = report.summary("t", "d")
        assert "compatible: yes" in summary and "384 identical" in summary and "differ" not in summary


def test_different_tokenizer_is_reported(saved_tokenizers):
    a, b = saved_tokenizers["target"], saved_tokenizers["other"]
    report = compare(a, b)
    assert not report.compatible
    assert (report.vocab_size_a, report.vocab_size_b) == (384, 320)
    by_id_a = {i: t for t, i in a.get_vocab().items()}
    by_id_b = {i: t for t, i in b.get_vocab().items()}
    expected_differing = sorted(i for i in range(384) if by_id_a.get(i) != by_id_b.get(i))
    assert len(report.differing) == len(expected_differing) > 64  # at least every id >= 320
    assert report.shared_tokens == 384 - len(expected_differing)
    first = expected_differing[0]
    assert report.differing[0] == f"id {first}: {by_id_a[first]!r} vs {by_id_b[first]!r}"
    assert report.differing[-1] == f"id 383: {by_id_a[383]!r} vs None"
    # the byte alphabet and the special tokens are shared; the merges are not
    assert report.special_differences == []
    assert report.probe_mismatches and len(report.probe_mismatches) <= len(PROBES)
    assert report.probe_mismatches[0].startswith(repr(PROBES[0][:30]))
    summary = report.summary("target", "other")
    assert "compatible: NO" in summary
    assert "tokens that differ" in summary and "probe strings encoded differently" in summary
    assert summary.count("; ") >= 9 and " ..." in summary  # long lists are cut at 10 examples


def test_special_token_difference_alone_makes_tokenizers_incompatible(tiny_tokenizer):
    other_eos = make_tokenizer()
    other_eos.eos_token = "<|user|>"
    report = compare(tiny_tokenizer, other_eos)
    assert report.differing == [] and report.probe_mismatches == []
    assert report.special_differences == [
        f"eos_token_id: {tiny_tokenizer.eos_token_id} vs {other_eos.eos_token_id}"
    ]
    assert not report.compatible
    assert "special tokens that differ" in report.summary()
