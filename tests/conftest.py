"""Shared fixtures: tiny seeded random Llama models with a real (in-process trained) byte-level BPE
tokenizer, saved like any Hugging Face model directory, and a cheap table-driven mock CausalLM.

Nothing is downloaded. Building and saving the three model directories takes about a second.
"""

from __future__ import annotations

import pytest
import torch

from helpers import TableModel
from specdecode.backends.precision import FP32

VOCAB = 384  # 256 byte symbols + 3 special tokens + 125 merges
EOS = "<|end|>"
SPECIALS = [EOS, "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = """The quick brown fox jumps over the lazy dog. The cat sat on the mat and looked at the dog.
Hello, world! How are you today? I am fine, thank you, and you? Speculative decoding drafts a few
tokens with a cheap model and verifies all of them with one forward pass of the large model.
def fibonacci(n):
    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))

SELECT id, name FROM users WHERE age >= 21 ORDER BY name;
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
One two three four five six seven eight nine ten. The numbers 1234567890 and 3.14159.
"""
OTHER_CORPUS = """Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt
ut labore et dolore magna aliqua. Zebra quartz jukebox vexing wizard; sphinx of black quartz, judge
my vow! fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }
"""


def make_tokenizer(vocab_size: int = VOCAB, corpus: str = CORPUS):
    """A byte-level BPE tokenizer trained in-process, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([corpus] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, additional_special_tokens=SPECIALS[1:]
    )
    fast.chat_template = CHAT_TEMPLATE
    assert len(fast) == vocab_size, len(fast)
    return fast


def make_sentencepiece_tokenizer(vocab_size: int = 200, corpus: str = CORPUS):
    """Another tokenizer family over the same text: SentencePiece-style pieces ('▁' for a space, no
    byte level, <unk> for characters it never saw), mostly single characters plus a few merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIALS, "<unk>"], show_progress=False
    )
    tok.train_from_iterator([corpus] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, unk_token="<unk>", additional_special_tokens=SPECIALS[1:]
    )
    assert len(fast) == vocab_size, len(fast)
    return fast


def make_llama(
    seed: int,
    vocab: int = VOCAB,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    eos_id: int = 0,
):
    """A seeded random fp32 Llama whose next-token distributions are peaked but not degenerate.

    With the default init (std 0.02) the logits are nearly flat (std ~0.2) and, worse, q·k is so small
    that attention is uniform, so positions (RoPE) would not matter and KV-cache position bugs would
    go unseen. Measured on seeded random prompts: std 0.2 for every weight makes the last-token argmax
    change in ~80% of cases when the positions of half the prompt are shifted; scaling the output layer
    by 2.5 then gives logits with std ~4 (mean entropy ~2 nats: peaked, yet sampling has choices).
    Batched (multi-token) and one-token forwards agree to ~2e-5 in the logits, far below the typical
    top-1/top-2 gap (~1); tests that need exact argmax agreement also check the margin on their path.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    return model


def _save(path, model, tokenizer) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_session():
    """One intra-op thread: these models are tiny, and on a small shared machine OpenMP threads that
    wait for a busy core made a softmax of 8 numbers take milliseconds instead of microseconds.
    Session-scoped so that module-scoped fixtures (set up before function-scoped ones) get it too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_torch_thread(_one_torch_thread_per_session):
    """Re-assert it per test, in case a test (e.g. a CLI --threads option) changed it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """Target: 2 layers, hidden 64, vocab 384, saved with its tokenizer (loadable by models.load)."""
    model = make_llama(seed=0, eos_id=tiny_tokenizer.eos_token_id)
    return _save(tmp_path_factory.mktemp("tiny_target"), model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """A smaller random model (1 layer, hidden 32, another seed) with the target's tokenizer."""
    model = make_llama(
        seed=1, layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, eos_id=tiny_tokenizer.eos_token_id
    )
    return _save(tmp_path_factory.mktemp("tiny_draft"), model, tiny_tokenizer)


@pytest.fixture(scope="session")
def other_tokenizer_dir(tmp_path_factory) -> str:
    """A model whose tokenizer differs: other training text and a smaller vocabulary (320)."""
    tok = make_tokenizer(vocab_size=320, corpus=OTHER_CORPUS)
    model = make_llama(
        seed=2, vocab=320, layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, eos_id=tok.eos_token_id
    )
    return _save(tmp_path_factory.mktemp("other_tokenizer"), model, tok)


@pytest.fixture(scope="session")
def sentencepiece_draft_dir(tmp_path_factory) -> str:
    """A small random model with a SentencePiece-style tokenizer (vocabulary 200): a cross-vocabulary
    drafter for the byte-level tiny target."""
    tok = make_sentencepiece_tokenizer()
    model = make_llama(
        seed=3, vocab=200, layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, eos_id=tok.eos_token_id
    )
    return _save(tmp_path_factory.mktemp("sentencepiece_draft"), model, tok)


@pytest.fixture(scope="session")
def target(tiny_model_dir):
    """The tiny target as a LoadedModel with the default backend (FastLlama for Llama models)."""
    from specdecode.backends import models

    return models.load(tiny_model_dir, FP32, "cpu")


@pytest.fixture(scope="session")
def target_hf(tiny_model_dir):
    """The same target weights through HF's own forward and DynamicCache (backend hf)."""
    from specdecode.backends import models

    return models.load(tiny_model_dir, FP32, "cpu", backend="hf")


@pytest.fixture(scope="session")
def draft(tiny_draft_dir):
    from specdecode.backends import models

    return models.load(tiny_draft_dir, FP32, "cpu")


@pytest.fixture
def tables():
    """(target, draft) TableModels on a vocabulary of 8 with different seeded logit tables."""
    return TableModel.random(8, seed=1), TableModel.random(8, seed=2)
