"""Tiny seeded random models and tokenizers, built in-process (no downloads), shared by the tests."""

from __future__ import annotations

import pytest
import torch

CORPUS = """
The quick brown fox jumps over the lazy dog. The cat sat on the mat and the dog sat on the log.
def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n
Speculative decoding drafts tokens with a small model and verifies them with a large one.
SELECT name, age FROM users WHERE age > 21 ORDER BY name;
{"name": "get_weather", "arguments": {"city": "Paris"}}
One two three four five six seven eight nine ten. Hello world! How are you today?
""" * 4
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB = 384

# Tiny models gain nothing from a second thread; idle OpenMP workers spinning on it only slow the
# loop-heavy statistical tests (and whatever else shares the machine). The real-model tests raise it.
torch.set_num_threads(1)


def make_tokenizer(vocab_size: int = VOCAB, corpus: str = CORPUS):
    """A byte-level BPE tokenizer trained on a small text, wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|end|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([corpus], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", bos_token="<|bos|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_llama(seed: int, layers: int = 2, hidden: int = 64, vocab: int = VOCAB, scale: float = 40.0):
    """A random Llama whose output layer is scaled up: peaked next-token distributions, so argmaxes
    are not near-ties that batched and single-token kernels could round apart."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=0, bos_token_id=1, pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def _save(path, model, tokenizer) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> str:
    return _save(tmp_path_factory.mktemp("tiny_target"), make_llama(seed=0), tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_tokenizer) -> str:
    return _save(tmp_path_factory.mktemp("tiny_draft"), make_llama(seed=1, layers=1, hidden=32), tiny_tokenizer)


@pytest.fixture(scope="session")
def other_tokenizer_dir(tmp_path_factory) -> str:
    tok = make_tokenizer(vocab_size=320, corpus=CORPUS[::-1] + "completely different words zebra quartz")
    return _save(tmp_path_factory.mktemp("other_tok"), make_llama(seed=2, vocab=320), tok)


@pytest.fixture(scope="session")
def target(tiny_model_dir):
    from specdecode import models

    return models.load(tiny_model_dir, "fp32", "cpu")


@pytest.fixture(scope="session")
def draft(tiny_draft_dir):
    from specdecode import models

    return models.load(tiny_draft_dir, "fp32", "cpu")


class TableModel:
    """A CausalLM whose logits depend only on the last token: logits = table[token]. Cheap and with
    exactly known distributions, for statistical tests through the real decoder loop."""

    def __init__(self, table: torch.Tensor):
        self.table = table  # [V, V]
        self.vocab_size = table.shape[0]
        self.device = torch.device("cpu")
        self.max_length = 10**6
        self.reset()

    def reset(self):
        self.length = 0

    def extend(self, tokens, num_logits=0):
        self.length += tokens.shape[0]
        out = self.table[tokens]
        return out[-num_logits:] if num_logits else out

    def truncate(self, length):
        self.length = min(self.length, length)


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, vocab, generator=g) * scale
