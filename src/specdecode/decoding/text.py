"""A completion's public text, as tokens arrive: one definition for `generate` and the server.

The text is the detokenized completion, cut before the earliest stop string; what is streamed is
only the part that cannot change any more: no tail that could still grow into a stop string, no
incomplete multi-byte character. The decoder works on token ids only; this layer owns the tokenizer.

Detokenizing is incremental (`Detokenizer`): decoding the whole completion at every step grows with
its length and is paid per stream per step, a noticeable share of a server step with many long
streams (docs/server.md).
"""

from __future__ import annotations

from collections.abc import Sequence

WINDOW = 6  # tokens of context decoded before the new ones (as vLLM's incremental detokenizer)


class Detokenizer:
    """decode(tokens) of a growing token list, decoding only a window at the end each time.

    The text of tokens[:read] is kept; new tokens are decoded together with the WINDOW tokens before
    `read` and the window's own text is cut off the front, so whatever a decoder does at the start
    of a decode (SentencePiece drops a leading space) happens alike to both. Where that cannot be
    trusted it decodes everything, exactly as before: when the window's text is not a prefix of the
    longer decode (a tokenizer's clean-up, " ." -> ".", joined text across the boundary), and while
    the text ends in an incomplete multi-byte character (U+FFFD: more bytes may complete it), the
    read point does not move."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.read = 0  # tokens whose text is `text_read`
        self.text_read = ""

    def text(self, tokens: list[int]) -> str:
        """decode(tokens, skip_special_tokens=True); tokens extend those of the previous call."""
        start = max(self.read - WINDOW, 0)
        window = self.decode(tokens[start : self.read])
        longer = self.decode(tokens[start:])
        if not longer.startswith(window):
            text = self.decode(tokens)  # the boundary's text changed: decode everything
            self.read, self.text_read = (len(tokens), text) if not text.endswith("\ufffd") else (0, "")
            return text
        text = self.text_read + longer[len(window) :]
        if not text.endswith("\ufffd"):
            self.read, self.text_read = len(tokens), text
        return text

    def decode(self, tokens: list[int]) -> str:
        """The text of any token ids, decoded whole (skip_special_tokens, as everywhere here)."""
        return self.tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""


class TextStream:
    def __init__(
        self, tokenizer, stops: Sequence[str] = (), eos_ids: set[int] | frozenset[int] = frozenset()
    ):
        self.eos_ids = eos_ids
        self.detokenizer = Detokenizer(tokenizer)
        self.stops = [s for s in stops if s]
        self.hold = (
            max((len(s) for s in self.stops), default=1) - 1
        )  # a stop string's start may still be growing
        self.tokens: list[
            int
        ] = []  # the completion's tokens (after a stop string: only those needed for the text)
        self.text = ""  # the completion's text so far, cut before a stop string
        self.streamed = 0  # characters of `text` handed out by push()
        self.finish_reason: str | None = None  # set when done: "stop" (EOS or stop string) or "length"

    def push(self, tokens: list[int], finished: bool) -> str:
        """Add a step's tokens (finished: the decoder stopped: EOS or token budget) -> the text newly
        safe to deliver. After a stop string, or when finished, `finish_reason` is set and everything
        left is delivered."""
        self.tokens.extend(tokens)
        text = self.detokenizer.text(self.tokens)
        cut = self._find(text)
        if cut >= 0:
            text, self.finish_reason = text[:cut], "stop"
            while len(self.tokens) > 1 and self._find(self.detokenizer.decode(self.tokens[:-1])) >= 0:
                self.tokens.pop()  # drop the tokens that only carry the stop string
        elif finished:
            self.finish_reason = "stop" if self.tokens and self.tokens[-1] in self.eos_ids else "length"
        self.text = text
        end = len(text) if self.finish_reason else self._safe_prefix(text)
        if end <= self.streamed:
            return ""
        delta, self.streamed = text[self.streamed : end], end
        return delta

    def _find(self, text: str) -> int:
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else -1

    def _safe_prefix(self, text: str) -> int:
        end = len(text) - self.hold
        while end > 0 and text[end - 1] == "\ufffd":  # an incomplete multi-byte character
            end -= 1
        return max(end, 0)
