"""The completion text as tokens arrive (decoding/text.py): the incremental detokenizer gives the full
decode at every step while decoding only a window, for byte-level and SentencePiece-style
tokenizers, through incomplete multi-byte characters, special tokens and a decoder that rewrites
text across token boundaries."""

from __future__ import annotations

import random
import re

import pytest

from conftest import make_sentencepiece_tokenizer, make_tokenizer
from specdecode.decoding.text import WINDOW, Detokenizer, TextStream

TEXT = "Ünïcödé 😀 数学 — it's fine , isn't it ? Yes ! x = {1, 2} ... done."


class Counting:
    """A tokenizer whose decode calls are recorded (their lengths); `clean` also joins a space before
    punctuation to it, as WordPiece's clean-up does: text that changes across a token boundary."""

    def __init__(self, tok, clean: bool = False):
        self.tok, self.clean, self.lengths = tok, clean, []

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **kwargs)

    def __len__(self):
        return len(self.tok)

    def decode(self, ids, skip_special_tokens=False):
        self.lengths.append(len(ids))
        text = self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return re.sub(r" ([,.!?])", r"\1", text) if self.clean else text


TOKENIZERS = {
    "byte-level": lambda: Counting(make_tokenizer()),
    "sentencepiece": lambda: Counting(make_sentencepiece_tokenizer()),
    "clean-up": lambda: Counting(make_tokenizer(), clean=True),
}


def _ids(tok, seed: int) -> list[int]:
    """Encoded text with multi-byte characters (split into byte tokens), random ids spliced in."""
    rng = random.Random(seed)
    ids = tok(TEXT * 3, add_special_tokens=False)["input_ids"]
    for _ in range(25):
        ids.insert(rng.randrange(len(ids) + 1), rng.randrange(len(tok)))
    return ids


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("seed", range(3))
def test_incremental_text_is_the_full_decode_at_every_step(name, seed):
    tok = TOKENIZERS[name]()
    ids, rng = _ids(tok, seed), random.Random(seed)
    detok, tokens, full_decodes = Detokenizer(tok), [], 0
    while len(tokens) < len(ids):
        tokens += ids[len(tokens) : len(tokens) + rng.randint(1, 4)]
        tok.lengths.clear()
        text = detok.text(tokens)
        full_decodes += max(tok.lengths) == len(tokens) > 2 * WINDOW
        assert text == tok.decode(tokens, skip_special_tokens=True)
    if name == "clean-up":
        assert full_decodes > 0  # the boundary's text changed, and it noticed
    else:  # a character split between steps waits in the window: never the whole text again
        assert full_decodes == 0


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_streamed_deltas_add_up_to_the_text_cut_at_a_stop_string(name):
    tok = TOKENIZERS[name]()
    ids = tok(TEXT * 2, add_special_tokens=False)["input_ids"]
    full = tok.decode(ids, skip_special_tokens=True)
    stream, out = TextStream(tok, ["done"]), []
    for i in range(0, len(ids), 3):
        out.append(stream.push(ids[i : i + 3], finished=i + 3 >= len(ids)))
        if stream.finish_reason:
            break
    assert stream.finish_reason == "stop"
    assert "".join(out) == stream.text == full[: full.index("done")]
