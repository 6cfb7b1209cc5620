"""Structured output: a grammar's allowed next tokens as masks on the target's logits (llguidance).

`Grammars` compiles what a request asks for (a JSON object, a JSON schema, a regex, a Lark grammar)
for one tokenizer; `Grammar` is one sequence's matcher. Under speculation (constraints.py):
- `allowed(prefix)`: how many leading drafted tokens the grammar accepts (a chain is cut there);
- `masks(prefixes)`: one mask per verified row, row r given the committed text and then the drafted
  tokens prefixes[r], so every verified position samples from the grammar-constrained target
  distribution exactly as plain constrained decoding would;
- `commit(tokens)`: the tokens the step committed move the matcher on.
Drafts are checked with `validate_tokens` (no state change), consumed only when allowed, and undone
with `rollback`: a matcher that consumed a forbidden token would stay in its error state.

llguidance (Microsoft's guidance grammar engine, an Earley parser over a token trie) was chosen over
xgrammar and outlines-core (scripts/grammar_mask_cost.py; docs/server.md): xgrammar's masks were
cheaper but its JSON strings with a maxLength accept raw control characters (invalid JSON), and
outlines-core takes seconds to compile a schema for a 49k vocabulary. When the grammar is complete,
only the stop tokens (the model's EOS ids) are allowed.
"""

from __future__ import annotations

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from specdecode.errors import UserError


class Grammars:
    """Compiles grammars for one tokenizer (llguidance grammars are compiled lazily, per matcher)."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int] | frozenset[int]):
        """vocab_size: the width of the target's logits (may exceed the tokenizer's)."""
        self.vocab_size, self.stop_ids = vocab_size, frozenset(stop_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=sorted(stop_ids)
        )

    def json_object(self) -> str:
        return self.json_schema({"type": "object"})

    def json_schema(self, schema: dict) -> str:
        """Compact JSON (no free whitespace: a model cannot loop on blanks) valid for `schema`."""
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False}
            )
        except ValueError as e:
            raise UserError(f"unsupported JSON schema: {e}") from None
        return self._checked(grammar, "JSON schema")

    def regex(self, pattern: str) -> str:
        return self._checked(llguidance.LLMatcher.grammar_from_regex(pattern), "regex")

    def lark(self, grammar: str) -> str:
        """A Lark grammar (llguidance's dialect) whose start rule is `start`."""
        return self._checked(llguidance.LLMatcher.grammar_from_lark(grammar), "grammar")

    def _checked(self, grammar: str, what: str) -> str:
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise UserError(f"invalid {what}: {error.splitlines()[0][:300]}")
        return grammar

    def matcher(self, grammar: str) -> Grammar:
        return Grammar(
            llguidance.LLMatcher(self.tokenizer, grammar, log_level=0), self.vocab_size, self.stop_ids
        )


class Grammar:
    """One sequence's grammar state: the committed tokens consumed, drafts tried and undone."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, stop_ids: frozenset[int]):
        self.matcher, self.vocab_size, self.stop_ids = matcher, vocab_size, stop_ids

    def allowed(self, prefix: list[int]) -> int:
        """How many leading tokens of `prefix` the grammar accepts after the committed text."""
        return self.matcher.validate_tokens(prefix) if prefix else 0

    def masks(self, prefixes: list[list[int]]) -> torch.Tensor:
        """prefixes: per row, the drafted tokens before it -> [R, ceil(V / 32)] int32 bitmask of the
        tokens allowed after the committed text and that prefix. A row whose prefix the grammar breaks
        is left all allowed: verification never reaches it, since the breaking token is masked out at
        its own row (constraints.py keeps such a tree node as a sure rejection)."""
        bitmask = llguidance.torch.allocate_token_bitmask(len(prefixes), self.vocab_size)
        bitmask.fill_(-1)  # all allowed
        for r, prefix in enumerate(prefixes):
            if self.allowed(prefix) < len(prefix):
                continue
            if prefix:
                self._consume(prefix)
            llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, r)
            if prefix:
                self.matcher.rollback(len(prefix))
        return bitmask

    def apply(self, logits: torch.Tensor, prefixes: list[list[int]]) -> torch.Tensor:
        """logits: [R, V] float32 -> the same tensor, tokens the grammar forbids at each row set to -inf."""
        llguidance.torch.apply_token_bitmask_inplace(logits, self.masks(prefixes))
        return logits

    def commit(self, tokens: list[int]) -> None:
        """A stop token after the grammar completed ends the text; the matcher has nothing to consume."""
        if self.matcher.is_stopped() and all(t in self.stop_ids for t in tokens):
            return
        self._consume(tokens)

    def _consume(self, tokens: list[int]) -> None:
        if not self.matcher.consume_tokens(tokens):
            raise ValueError(f"the grammar refused tokens {tokens}: {self.matcher.get_error()[:300]}")
