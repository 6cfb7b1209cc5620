"""A completion's public text, as tokens arrive: one definition for `generate` and the server.

The text is the detokenized completion, cut before the earliest stop string; what is streamed is
only the part that cannot change any more: no tail that could still grow into a stop string, no
incomplete multi-byte character. The decoder works on token ids only; this layer owns the tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    def __init__(
        self, tokenizer, stops: Sequence[str] = (), eos_ids: set[int] | frozenset[int] = frozenset()
    ):
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
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
        text = self._decode(self.tokens)
        cut = self._find(text)
        if cut >= 0:
            text, self.finish_reason = text[:cut], "stop"
            while len(self.tokens) > 1 and self._find(self._decode(self.tokens[:-1])) >= 0:
                self.tokens.pop()  # drop the tokens that only carry the stop string
        elif finished:
            self.finish_reason = "stop" if self.tokens and self.tokens[-1] in self.eos_ids else "length"
        self.text = text
        end = len(text) if self.finish_reason else self._safe_prefix(text)
        if end <= self.streamed:
            return ""
        delta, self.streamed = text[self.streamed : end], end
        return delta

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _find(self, text: str) -> int:
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else -1

    def _safe_prefix(self, text: str) -> int:
        end = len(text) - self.hold
        while end > 0 and text[end - 1] == "\ufffd":  # an incomplete multi-byte character
            end -= 1
        return max(end, 0)
