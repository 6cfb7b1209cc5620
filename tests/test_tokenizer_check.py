from specdecode.models import load_tokenizer
from specdecode.tokenizer_check import compare


def test_same_tokenizer_is_compatible(tiny_model_dir, tiny_draft_dir):
    report = compare(load_tokenizer(tiny_model_dir), load_tokenizer(tiny_draft_dir))
    assert report.compatible and report.shared_tokens == report.vocab_size_a == report.vocab_size_b
    assert "compatible: yes" in report.summary()


def test_different_tokenizers_name_the_differences(tiny_model_dir, other_tokenizer_dir):
    report = compare(load_tokenizer(tiny_model_dir), load_tokenizer(other_tokenizer_dir))
    assert not report.compatible
    assert report.vocab_size_b == 320 and report.shared_tokens < report.vocab_size_a
    assert report.differing and report.differing[0].startswith("id ")
    assert report.probe_mismatches
    assert "compatible: NO" in report.summary("t", "o")


def test_same_vocab_but_different_encoding_is_caught(tiny_tokenizer):
    import copy

    other = copy.deepcopy(tiny_tokenizer)
    other.eos_token = "<|bos|>"  # same vocabulary, different special token
    report = compare(tiny_tokenizer, other)
    assert not report.compatible and report.special_differences
