"""Structured output: a grammar's allowed next tokens as masks on the target's logits (xgrammar).

`Grammars` compiles what a request asks for (a JSON object, a JSON schema, a regex, an EBNF grammar)
for one tokenizer; `Grammar` is one sequence's matcher. Under speculation (constraints.py):
- `allowed(prefix)`: how many leading drafted tokens the grammar accepts (a chain is cut there);
- `masks(prefixes)`: one mask per verified row, row r given the committed text and then the drafted
  tokens prefixes[r], so every verified position samples from the grammar-constrained target
  distribution exactly as plain constrained decoding would;
- `commit(tokens)`: the tokens the step committed move the matcher on.
Drafts are tried with `accept_token` and undone with `rollback`; the committed state never moves.

xgrammar (Dong et al. 2024, "XGrammar: Flexible and Efficient Structured Generation Engine for Large
Language Models") was chosen over llguidance and outlines-core for its per-token mask cost on the CPU
(scripts/grammar_mask_cost.py; docs/server.md): verification needs a mask per drafted row, a tree
one per node. When the grammar is complete, only the stop tokens (the model's EOS ids) are allowed.
"""

from __future__ import annotations

import json

import torch
import xgrammar

from specdecode.errors import UserError


class Grammars:
    """Compiles grammars for one tokenizer; a compiled grammar is shared by the sequences that use it."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int] | frozenset[int]):
        """vocab_size: the width of the target's logits (may exceed the tokenizer's)."""
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids)
        )
        self.vocab_size = vocab_size
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def json_object(self) -> xgrammar.CompiledGrammar:
        return self.json_schema({"type": "object"})

    def json_schema(self, schema: dict) -> xgrammar.CompiledGrammar:
        """Compact JSON (no free whitespace: a model cannot loop on blanks) valid for `schema`."""
        try:
            return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as e:
            raise UserError(f"unsupported JSON schema: {e}") from None

    def regex(self, pattern: str) -> xgrammar.CompiledGrammar:
        try:
            return self.compiler.compile_regex(pattern)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"invalid regex: {e}") from None

    def ebnf(self, grammar: str) -> xgrammar.CompiledGrammar:
        """An EBNF (GBNF) grammar whose start rule is `root`."""
        try:
            return self.compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"invalid grammar: {e}") from None

    def matcher(self, compiled: xgrammar.CompiledGrammar) -> Grammar:
        return Grammar(xgrammar.GrammarMatcher(compiled), self.vocab_size)


class Grammar:
    """One sequence's grammar state: the committed tokens consumed, drafts tried and undone."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size

    def allowed(self, prefix: list[int]) -> int:
        """How many leading tokens of `prefix` the grammar accepts after the committed text."""
        n = 0
        for token in prefix:
            if not self.matcher.accept_token(token):
                break
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def masks(self, prefixes: list[list[int]]) -> torch.Tensor:
        """prefixes: per row, the drafted tokens before it -> [R, ceil(V / 32)] int32 bitmask (xgrammar's
        layout) of the tokens allowed after the committed text and that prefix. A row whose prefix the
        grammar breaks is left all allowed: verification never reaches it, since the breaking token is
        masked out at its own row (constraints.py keeps such a tree node as a sure rejection)."""
        bitmask = xgrammar.allocate_token_bitmask(len(prefixes), self.vocab_size)  # all allowed
        for r, prefix in enumerate(prefixes):
            n = 0
            for token in prefix:
                if not self.matcher.accept_token(token):
                    break
                n += 1
            if n == len(prefix):
                self.matcher.fill_next_token_bitmask(bitmask, r)
            if n:
                self.matcher.rollback(n)
        return bitmask

    def apply(self, logits: torch.Tensor, prefixes: list[list[int]]) -> torch.Tensor:
        """logits: [R, V] float32 -> the same tensor, tokens the grammar forbids at each row set to -inf."""
        xgrammar.apply_token_bitmask_inplace(logits, self.masks(prefixes), vocab_size=self.vocab_size)
        return logits

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            if not self.matcher.accept_token(token):
                raise ValueError(f"token {token} was committed but the grammar forbids it")

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
